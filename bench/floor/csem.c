/* The floor of a plain acquire/release pair as a minimal C module: the non-fair recipe's work
 * (prune expired holders, count, add, move the key's expiry) and a release, with the effects
 * replicated one command per change, as a module must when it reads the clock. With ACL=1 the
 * command also checks the caller's user on four derived keys, as a module without a command
 * filter must. Not part of the project: a measuring stick. */
#define REDISMODULE_EXPERIMENTAL_API
#include "redismodule.h" /* from the redis-module crate: bench/floor/measure */
#include <string.h>
#include <errno.h>

static int check_acl = 0;
static RedisModuleBlockedClient *waiter = NULL;
static RedisModuleString *waiter_id = NULL, *waiter_name = NULL;
static long long waiter_lease = 0;
static int grant_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
static int timeout_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
static void free_data(RedisModuleCtx *ctx, void *privdata);

static int acl_ok(RedisModuleCtx *ctx, RedisModuleString *name) {
    if (!check_acl) return 1;
    RedisModuleString *uname = RedisModule_GetClientUserNameById(ctx, RedisModule_GetClientId(ctx));
    if (!uname) return 1;
    RedisModuleUser *u = RedisModule_GetModuleUserFromUserName(uname);
    RedisModule_FreeString(ctx, uname);
    if (!u) return 0;
    size_t len; const char *p = RedisModule_StringPtrLen(name, &len);
    const char *suf[4] = {":owner", ":counter", ":permits", ":limit"};
    int ok = 1;
    for (int i = 0; i < 4 && ok; i++) {
        char buf[256]; size_t sl = strlen(suf[i]);
        memcpy(buf, p, len); memcpy(buf + len, suf[i], sl);
        RedisModuleString *k = RedisModule_CreateString(NULL, buf, len + sl);
        ok = RedisModule_ACLCheckKeyPermissions(u, k, REDISMODULE_CMD_KEY_ACCESS|REDISMODULE_CMD_KEY_UPDATE|REDISMODULE_CMD_KEY_INSERT|REDISMODULE_CMD_KEY_DELETE) == REDISMODULE_OK;
        RedisModule_FreeString(NULL, k);
    }
    RedisModule_FreeModuleUser(u);
    return ok;
}

/* CSEM.ACQUIRE name limit lease_ms id */
static int acquire(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5 && argc != 6) return RedisModule_WrongArity(ctx);
    long long limit, lease;
    if (RedisModule_StringToLongLong(argv[2], &limit) != REDISMODULE_OK ||
        RedisModule_StringToLongLong(argv[3], &lease) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, "ERR bad number");
    if (!acl_ok(ctx, argv[1])) return RedisModule_ReplyWithError(ctx, "NOPERM");
    long long now = RedisModule_Milliseconds();
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ|REDISMODULE_WRITE);
    int type = RedisModule_KeyType(key);
    if (type != REDISMODULE_KEYTYPE_EMPTY && type != REDISMODULE_KEYTYPE_ZSET) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    if (type == REDISMODULE_KEYTYPE_ZSET) {
        /* Prune expired holders, each one effect. */
        RedisModule_ZsetFirstInScoreRange(key, REDISMODULE_NEGATIVE_INFINITE, (double)now, 0, 0);
        while (!RedisModule_ZsetRangeEndReached(key)) {
            double score;
            RedisModuleString *m = RedisModule_ZsetRangeCurrentElement(key, &score);
            RedisModule_ZsetRangeNext(key);
            RedisModule_ZsetRem(key, m, NULL);
            RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], m);
            RedisModule_FreeString(ctx, m);
        }
        RedisModule_ZsetRangeStop(key);
    }
    if ((long long)RedisModule_ValueLength(key) >= limit) {
        RedisModule_CloseKey(key);
        long long wait_ms;
        if (argc == 6 && !waiter && RedisModule_StringToLongLong(argv[5], &wait_ms) == REDISMODULE_OK) {
            if (waiter_id) RedisModule_FreeString(NULL, waiter_id);
            if (waiter_name) RedisModule_FreeString(NULL, waiter_name);
            RedisModule_RetainString(NULL, argv[4]); waiter_id = argv[4];
            RedisModule_RetainString(NULL, argv[1]); waiter_name = argv[1];
            waiter_lease = lease;
            waiter = RedisModule_BlockClient(ctx, grant_reply, timeout_reply, free_data, wait_ms);
            return REDISMODULE_OK;
        }
        return RedisModule_ReplyWithNull(ctx);
    }
    long long deadline = now + lease;
    int flags = 0;
    RedisModule_ZsetAdd(key, (double)deadline, argv[4], &flags);
    RedisModule_Replicate(ctx, "ZADD", "sls", argv[1], deadline, argv[4]);
    mstime_t expire = RedisModule_GetAbsExpire(key);
    if (expire < deadline) {
        RedisModule_SetAbsExpire(key, deadline);
        RedisModule_Replicate(ctx, "PEXPIREAT", "sl", argv[1], deadline);
    }
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithString(ctx, argv[4]);
}

/* One waiter at a time is enough for the floor of a hand-off: the blocked client, its id and
 * lease, and the name. */

/* The waiter's reply: it is granted now, in the releaser's wake (key work and effects here). */
static int grant_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    RedisModuleString *id = RedisModule_GetBlockedClientPrivateData(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, waiter_name, REDISMODULE_READ|REDISMODULE_WRITE);
    long long deadline = RedisModule_Milliseconds() + waiter_lease;
    int flags = 0;
    RedisModule_ZsetAdd(key, (double)deadline, id, &flags);
    RedisModule_Replicate(ctx, "ZADD", "sls", waiter_name, deadline, id);
    if (RedisModule_GetAbsExpire(key) < deadline) {
        RedisModule_SetAbsExpire(key, deadline);
        RedisModule_Replicate(ctx, "PEXPIREAT", "sl", waiter_name, deadline);
    }
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithString(ctx, id);
}
static int timeout_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    waiter = NULL;
    return RedisModule_ReplyWithNull(ctx);
}
static void free_data(RedisModuleCtx *ctx, void *privdata) { (void)ctx; (void)privdata; }

/* CSEM.RELEASE name id */
static int release(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    if (!acl_ok(ctx, argv[1])) return RedisModule_ReplyWithError(ctx, "NOPERM");
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ|REDISMODULE_WRITE);
    int type = RedisModule_KeyType(key);
    int deleted = 0;
    if (type == REDISMODULE_KEYTYPE_ZSET) {
        RedisModule_ZsetRem(key, argv[2], &deleted);
        if (deleted) RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], argv[2]);
    }
    RedisModule_CloseKey(key);
    if (deleted && waiter) {
        RedisModuleBlockedClient *bc = waiter;
        waiter = NULL;
        RedisModule_UnblockClient(bc, waiter_id);
    }
    return RedisModule_ReplyWithLongLong(ctx, deleted);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (RedisModule_Init(ctx, "csem", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    if (argc >= 1) { long long v; if (RedisModule_StringToLongLong(argv[0], &v) == REDISMODULE_OK) check_acl = (int)v; }
    if (RedisModule_CreateCommand(ctx, "csem.acquire", acquire, "write deny-oom", 1, 1, 1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "csem.release", release, "write", 1, 1, 1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
