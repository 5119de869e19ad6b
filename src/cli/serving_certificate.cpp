#include "cli/serving_certificate.h"

#include <fmt/core.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace tessera::cli {

struct ServingCertificate::Pair {
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;  // the intermediates after the leaf, if any
  EVP_PKEY* key = nullptr;
  Pair() = default;
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  ~Pair() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

namespace {

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block found";
  char text[256] = {};
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// The file open for reading, or null with `why` naming it.
File open_pem(const std::string& path, std::string& why) {
  File file(std::fopen(path.c_str(), "r"));
  if (!file) why = fmt::format("cannot read {}: {}", path, std::strerror(errno));
  return file;
}

}  // namespace

ServingCertificate::ServingCertificate(std::string certificate_file, std::string key_file,
                                       base::Reporter report)
    : certificate_file_(std::move(certificate_file)),
      key_file_(std::move(key_file)),
      report_(std::move(report)) {
  certificate_stamp_ = stamp_of(certificate_file_);
  key_stamp_ = stamp_of(key_file_);
  std::string why;
  serving_ = load(why);
  if (!serving_) throw std::runtime_error(why);
}

ServingCertificate::~ServingCertificate() = default;

ServingCertificate::Stamp ServingCertificate::stamp_of(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return {};
  return {status.st_dev, status.st_ino, status.st_size,
          status.st_mtim.tv_sec * 1000000000LL + status.st_mtim.tv_nsec};
}

std::shared_ptr<const ServingCertificate::Pair> ServingCertificate::load(std::string& why) const {
  auto pair = std::make_shared<Pair>();
  ERR_clear_error();
  const File certificate = open_pem(certificate_file_, why);
  if (!certificate) return nullptr;
  pair->leaf = PEM_read_X509_AUX(certificate.get(), nullptr, nullptr, nullptr);
  if (pair->leaf == nullptr) {
    why = fmt::format("{} holds no PEM certificate ({})", certificate_file_, openssl_error());
    return nullptr;
  }
  pair->chain = sk_X509_new_null();
  while (X509* next = PEM_read_X509(certificate.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(pair->chain, next);
  }
  ERR_clear_error();  // the end of the file reads as an error
  const File key = open_pem(key_file_, why);
  if (!key) return nullptr;
  pair->key = PEM_read_PrivateKey(key.get(), nullptr, nullptr, nullptr);
  if (pair->key == nullptr) {
    why = fmt::format("{} holds no PEM private key ({})", key_file_, openssl_error());
    return nullptr;
  }
  if (X509_check_private_key(pair->leaf, pair->key) != 1) {
    ERR_clear_error();
    why = fmt::format("the key in {} is not the certificate's in {}", key_file_, certificate_file_);
    return nullptr;
  }
  return pair;
}

std::shared_ptr<const ServingCertificate::Pair> ServingCertificate::current() {
  base::MutexLock locked(mutex_);
  const Stamp certificate = stamp_of(certificate_file_), key = stamp_of(key_file_);
  if (certificate == certificate_stamp_ && key == key_stamp_) return serving_;
  certificate_stamp_ = certificate;
  key_stamp_ = key;
  std::string why;
  if (auto renewed = load(why)) {
    serving_ = std::move(renewed);
    report_(fmt::format("serving the certificate in {} as it is now", certificate_file_));
  } else {  // said once per change of the files; the next change is tried again
    report_(fmt::format("{}; still serving the certificate read before", why));
  }
  return serving_;
}

int ServingCertificate::choose(SSL* connection, void* self) {
  const std::shared_ptr<const Pair> pair = static_cast<ServingCertificate*>(self)->current();
  // The connection takes its own references: a renewal later does not pull them away.
  return SSL_use_cert_and_key(connection, pair->leaf, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

bool ServingCertificate::configure(SSL_CTX& context) {
  SSL_CTX_set_options(&context, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_min_proto_version(&context, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(&context, &ServingCertificate::choose, this);
  return true;
}

}  // namespace tessera::cli
