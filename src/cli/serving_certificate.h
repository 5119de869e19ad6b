// The HTTPS server's certificate and key, read from PEM files and read again when the files
// change: a certificate renewed in place (cert-manager, a Secret volume's atomic swap) is
// served from the next TLS handshake on, without a restart. A renewal that cannot be used (a
// file half-written, a key that is not the certificate's) is reported once and the last good
// pair keeps serving.
#pragma once

#include <openssl/ssl.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "base/log.h"
#include "base/mutex.h"

namespace tessera::cli {

class ServingCertificate {
 public:
  // Throws std::runtime_error naming the file at fault if the pair cannot serve now.
  ServingCertificate(std::string certificate_file, std::string key_file, base::Reporter report);
  ~ServingCertificate();
  ServingCertificate(const ServingCertificate&) = delete;
  ServingCertificate& operator=(const ServingCertificate&) = delete;

  // Sets up a server context: TLS 1.2 or later, and the certificate chosen per handshake.
  bool configure(SSL_CTX& context);

 private:
  struct Pair;  // a certificate chain and its key, as OpenSSL holds them
  struct Stamp {
    dev_t device = 0;
    ino_t inode = 0;
    off_t size = 0;
    long long modified_ns = 0;
    bool operator==(const Stamp&) const = default;
  };
  // Reads the files again if they changed since last read; the pair to serve.
  std::shared_ptr<const Pair> current();
  // The pair in the files, or null with `why`.
  std::shared_ptr<const Pair> load(std::string& why) const;
  static Stamp stamp_of(const std::string& path);
  static int choose(SSL* connection, void* self);

  const std::string certificate_file_, key_file_;
  const base::Reporter report_;
  base::Mutex mutex_;  // handshakes on several threads ask for the pair at once
  std::shared_ptr<const Pair> serving_ GUARDED_BY(mutex_);
  // Of the files when last read, served or not.
  Stamp certificate_stamp_ GUARDED_BY(mutex_), key_stamp_ GUARDED_BY(mutex_);
};

}  // namespace tessera::cli
