/* The IREE executable-plugin side of a PLeX backend: query, load, resolve.
 *
 * IREE's local executable loader asks each registered plugin for the imports an executable
 * declares; PLeX's dispatches import `plex_<backend>_<op>`, resolved here to a thunk that unpacks the
 * argument struct IREE's codegen packs (one field per call operand, in order) and calls the
 * backend's function. The structures below follow IREE's executable plugin ABI v0.1
 * (iree/hal/local/executable_plugin.h at the pinned release), declared here so a backend builds
 * with gcc alone.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "plex_backend.h"

typedef struct {
  uint32_t version;
  const char* name;
  const char* description;
  uint32_t features;
  int32_t sanitizer;
  uint64_t reserved[8];
} iree_plugin_header_t;

typedef struct {
  void* self;
  void* ctl;
} iree_plugin_allocator_t;

typedef struct {
  iree_plugin_allocator_t host_allocator;
} iree_plugin_environment_t;

typedef struct {
  size_t count;
  const char* const* symbol_names;
  void** out_fn_ptrs;
  void** out_fn_contexts;
} iree_plugin_resolve_params_t;

typedef struct {
  const iree_plugin_header_t* header;
  void* (*load)(const iree_plugin_environment_t*, size_t, const void*, void**);
  void (*unload)(void*);
  void* (*resolve)(void*, const iree_plugin_resolve_params_t*, uint32_t*);
} iree_plugin_v0_t;

#define IREE_PLUGIN_STATUS_NOT_FOUND ((void*)(uintptr_t)5)
#define IREE_PLUGIN_RESOLUTION_MISSING_OPTIONAL 1u

#ifndef PLEX_BACKEND_NAME
#define PLEX_BACKEND_NAME "plex-backend"
#endif

static int plex_matmul_thunk(void* params, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  return plex_backend_matmul((const plex_matmul_args_t*)params);
}

static int plex_attention_thunk(void* params, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  return plex_backend_attention((const plex_attention_args_t*)params);
}

static int plex_gelu_thunk(void* params, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  return plex_backend_gelu((const plex_gelu_args_t*)params);
}

static const struct {
  const char* name;
  void* fn;
  const void* impl; /* the backend's op function: NULL where it does not define it (weak) */
} plex_imports[] = {
    /* import names carry the backend's name: two backends in one process never collide */
    {"plex_" PLEX_BACKEND_NAME "_matmul", (void*)plex_matmul_thunk, (const void*)plex_backend_matmul},
    {"plex_" PLEX_BACKEND_NAME "_attention", (void*)plex_attention_thunk,
     (const void*)plex_backend_attention},
    {"plex_" PLEX_BACKEND_NAME "_gelu", (void*)plex_gelu_thunk, (const void*)plex_backend_gelu},
};

static void* plex_plugin_load(const iree_plugin_environment_t* environment, size_t param_count,
                              const void* params, void** out_self) {
  (void)environment;
  (void)param_count;
  (void)params;
  *out_self = NULL;
  return NULL; /* OK */
}

static void plex_plugin_unload(void* self) { (void)self; }

static void* plex_plugin_resolve(void* self, const iree_plugin_resolve_params_t* params,
                                 uint32_t* out_resolution) {
  (void)self;
  *out_resolution = 0;
  int missing = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue; /* resolved by another provider */
    const char* name = params->symbol_names[i];
    int optional = name[0] == '?';
    if (optional) ++name;
    int found = 0;
    for (size_t j = 0; j < sizeof(plex_imports) / sizeof(plex_imports[0]); ++j) {
      if (plex_imports[j].impl && strcmp(name, plex_imports[j].name) == 0) {
        params->out_fn_ptrs[i] = plex_imports[j].fn;
        params->out_fn_contexts[i] = NULL;
        found = 1;
        break;
      }
    }
    if (!found) {
      if (optional) {
        *out_resolution |= IREE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
      } else {
        missing = 1;
      }
    }
  }
  return missing ? IREE_PLUGIN_STATUS_NOT_FOUND : NULL;
}

__attribute__((visibility("default"))) const iree_plugin_header_t** iree_hal_executable_plugin_query(
    uint32_t max_version, void* reserved) {
  (void)reserved;
  static const iree_plugin_header_t header = {
      .version = 1u,
      .name = PLEX_BACKEND_NAME,
      .description = "PLeX external backend (ABI 1)",
      .features = 0u,
      .sanitizer = 0,
  };
  static const iree_plugin_v0_t plugin = {
      .header = &header,
      .load = plex_plugin_load,
      .unload = plex_plugin_unload,
      .resolve = plex_plugin_resolve,
  };
  return max_version <= 1u ? (const iree_plugin_header_t**)&plugin : NULL;
}

/* The ABI version this plugin was built for; the runtime checks it before loading. */
__attribute__((visibility("default"))) int plex_backend_abi_version(void) {
  return PLEX_BACKEND_ABI_VERSION;
}

/* The runtime calls this (through ctypes) with its thread count; backends may ignore it. */
__attribute__((weak)) void plex_backend_set_threads(int threads) { (void)threads; }
