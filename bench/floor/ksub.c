/* The floor of following key events on a server that cannot unsubscribe: a minimal C module
 * that subscribes to expired and evicted keyspace events (optionally generic too) at load and
 * does nothing with them (module argument `generic`: deletions, renames and moves too), as a
 * module must where the server cannot end a subscription. Not part of the project: a measuring
 * stick (bench/floor/host). */
#include "redismodule.h"
#include <string.h>

static int on_event(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *key) {
    (void)ctx; (void)type; (void)event; (void)key;
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (RedisModule_Init(ctx, "ksub", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    int types = REDISMODULE_NOTIFY_EXPIRED | REDISMODULE_NOTIFY_EVICTED;
    if (argc > 0) {
        size_t len; const char *a = RedisModule_StringPtrLen(argv[0], &len);
        if (len == 7 && !memcmp(a, "generic", 7)) types |= REDISMODULE_NOTIFY_GENERIC;
    }
    return RedisModule_SubscribeToKeyspaceEvents(ctx, types, on_event);
}
