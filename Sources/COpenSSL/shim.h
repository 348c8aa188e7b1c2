// The parts of OpenSSL's libcrypto (Debian: libssl-dev, 3.0) that Swift cannot call directly.
// Every wrapper says why it exists. Everything else is called straight from Swift.
#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>

// OPENSSL_free is a macro (it passes __FILE__ and __LINE__ to CRYPTO_free).
static inline void COpenSSL_free(void *pointer) { OPENSSL_free(pointer); }

// EVP_EC_gen is a macro over the variadic EVP_PKEY_Q_keygen.
static inline EVP_PKEY *COpenSSL_generate_ec_key(const char *curve) { return EVP_EC_gen(curve); }

// EVP_RSA_gen is a macro over the variadic EVP_PKEY_Q_keygen.
static inline EVP_PKEY *COpenSSL_generate_rsa_key(unsigned int bits) { return EVP_RSA_gen(bits); }

// BIO_get_mem_data is a macro over BIO_ctrl.
static inline long COpenSSL_bio_mem_data(BIO *bio, char **data) { return BIO_get_mem_data(bio, data); }

#endif
