/* The floor of following the key server event (deleted, expired, evicted, overwritten) on
 * Redis 7.2 and later and Valkey: a minimal C module that subscribes to it at load and reads
 * each key's name, as a module must to tell its own keys from the others. Not part of the
 * project: a measuring stick (bench/floor/host), for the module's choice on Valkey 8.1 to 9.0. */
#include "redismodule.h"

static volatile size_t seen;

static void on_key(RedisModuleCtx *ctx, RedisModuleEvent event, uint64_t subevent, void *data) {
    (void)ctx; (void)event; (void)subevent;
    RedisModuleKeyInfoV1 *info = data;
    size_t len;
    const char *name = RedisModule_StringPtrLen(RedisModule_GetKeyNameFromModuleKey(info->key), &len);
    seen += len + (size_t)(len ? name[0] : 0);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    if (RedisModule_Init(ctx, "kev", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    /* Redis 7.0 has no key server event: there the module loads and follows nothing. */
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_Key, on_key);
    return REDISMODULE_OK;
}
