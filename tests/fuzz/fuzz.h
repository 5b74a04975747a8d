/* fuzz.h - the fuzz targets' bodies, shared by the libFuzzer programs (built with clang) and by the
 * mutation replay test (built with the project's compiler). Each returns 1 when the input was accepted,
 * 0 when refused, and aborts when an invariant breaks (a refusal without a proper message, a dump that
 * does not parse back, a layout that does not add up). */
#ifndef ZS_FUZZ_H
#define ZS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int zs_fuzz_manifest(const uint8_t *data, size_t size);
int zs_fuzz_safetensors(const uint8_t *data, size_t size);
int zs_fuzz_config(const uint8_t *data, size_t size);

#endif /* ZS_FUZZ_H */
