// The HTTPS server's certificate: served from the files, a renewal in place served from the
// next handshake on, a renewal that cannot be used reported while the last good pair serves.
// Pairs are made with the openssl command, as an operator would; handshakes run in memory.
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli/serving_certificate.h"
#include "support.h"

namespace tessera::test {
namespace {

// A self-signed pair for `name` at certificate and key.
void make_pair(const std::string& name, const std::string& certificate, const std::string& key) {
  const Finished made = run({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out",
                             certificate, "-days", "2", "-subj", "/CN=" + name});
  ASSERT_EQ(made.exit_code, 0) << made.err;
}

// The common name of the certificate a client is served in a handshake with `server`.
std::string served_name(SSL_CTX* server_context) {
  SSL_CTX* client_context = SSL_CTX_new(TLS_client_method());
  SSL* client = SSL_new(client_context);
  SSL* server = SSL_new(server_context);
  BIO *client_end = nullptr, *server_end = nullptr;
  BIO_new_bio_pair(&client_end, 0, &server_end, 0);
  SSL_set_bio(client, client_end, client_end);
  SSL_set_bio(server, server_end, server_end);
  SSL_set_connect_state(client);
  SSL_set_accept_state(server);
  bool done = false;
  for (int step = 0; step < 50 && !done; ++step) {
    const int from_client = SSL_do_handshake(client);
    const int from_server = SSL_do_handshake(server);
    done = from_client == 1 && from_server == 1;
  }
  std::string name = done ? "" : "(no handshake)";
  if (X509* certificate = SSL_get1_peer_certificate(client)) {
    char text[256] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(certificate), NID_commonName, text,
                              sizeof text);
    name = text;
    X509_free(certificate);
  }
  SSL_free(server);
  SSL_free(client);
  SSL_CTX_free(client_context);
  ERR_clear_error();
  return name;
}

// Puts the files at `from` in place of `to` as a Secret volume does: a rename.
void swap_in(const std::string& from, const std::string& to) {
  ASSERT_EQ(std::rename(from.c_str(), to.c_str()), 0);
}

TEST(CliServingCertificate, ARenewalInPlaceIsServedFromTheNextHandshake) {
  ScratchDirectory scratch;
  const std::string certificate = scratch.file("tls.crt"), key = scratch.file("tls.key");
  make_pair("first", certificate, key);
  std::vector<std::string> said;
  cli::ServingCertificate serving(certificate, key,
                                  [&](const std::string& text) { said.push_back(text); });
  SSL_CTX* context = SSL_CTX_new(TLS_server_method());
  ASSERT_TRUE(serving.configure(*context));
  EXPECT_EQ(served_name(context), "first");
  EXPECT_TRUE(said.empty());

  make_pair("second", scratch.file("new.crt"), scratch.file("new.key"));
  swap_in(scratch.file("new.key"), key);
  swap_in(scratch.file("new.crt"), certificate);
  EXPECT_EQ(served_name(context), "second");
  ASSERT_FALSE(said.empty());
  EXPECT_EQ(said.back(), "serving the certificate in " + certificate + " as it is now");

  // Half-written: the last good pair keeps serving, and that is said once.
  std::ofstream(scratch.file("broken.crt")) << "-----BEGIN CERTIFICATE-----\nMIIB";
  swap_in(scratch.file("broken.crt"), certificate);
  said.clear();
  EXPECT_EQ(served_name(context), "second");
  EXPECT_EQ(served_name(context), "second");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("still serving the certificate read before"), std::string::npos)
      << said[0];
  SSL_CTX_free(context);
}

TEST(CliServingCertificate, APairThatCannotServeIsRefusedNamingTheFile) {
  ScratchDirectory scratch;
  make_pair("one", scratch.file("one.crt"), scratch.file("one.key"));
  make_pair("two", scratch.file("two.crt"), scratch.file("two.key"));
  const auto refusal = [&](const std::string& certificate, const std::string& key) {
    try {
      cli::ServingCertificate serving(certificate, key, [](const std::string&) {});
    } catch (const std::runtime_error& refused) {
      return std::string(refused.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal(scratch.file("one.crt"), scratch.file("two.key")),
            "the key in " + scratch.file("two.key") + " is not the certificate's in " +
                scratch.file("one.crt"));
  EXPECT_NE(refusal(scratch.file("none.crt"), scratch.file("one.key"))
                .find("cannot read " + scratch.file("none.crt")),
            std::string::npos);
  EXPECT_NE(refusal(scratch.file("one.key"), scratch.file("one.key"))
                .find(scratch.file("one.key") + " holds no PEM certificate"),
            std::string::npos);
  EXPECT_EQ(refusal(scratch.file("one.crt"), scratch.file("one.key")), "");
}

}  // namespace
}  // namespace tessera::test
