// libFuzzer's driver, which fuzz targets run from their own `main`.
#include <stddef.h>
#include <stdint.h>

// Declared by libFuzzer (FuzzerInterface.h, LLVM 13 and later), which the toolchain links into
// every `-sanitize=fuzzer` build but whose header it does not ship.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
