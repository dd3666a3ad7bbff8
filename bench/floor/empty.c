/* The floor of a module's mere presence: a minimal C module that loads and does nothing (the
 * server's housekeeping for modules every turn of its event loop is what it costs). Not part of
 * the project: a measuring stick (bench/floor/host). */
#include "redismodule.h"

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_Init(ctx, "empty", 1, REDISMODULE_APIVER_1);
}
