/* The floor of a plain acquire/release pair as a minimal C module: the non-fair recipe's work
 * (prune expired holders, count, add, move the key's expiry) and a release, with the effects
 * replicated one command per change, as a module must when it reads the clock. With ACL=1 the
 * command also checks the caller's user on four derived keys, as a module without a command
 * filter must. With WORK=1 (the second argument) it also does the rest of what redsem does around
 * the same calls, in C: a look for the three keys a semaphore may have besides its holders, a
 * `sem.acquire`/`sem.release` keyspace event per change, and for a wait its own timer for the
 * wait's end, the next lease end looked up, and the flush and swap server events followed while
 * it waits (ended when it is served). Not part of the project: a measuring stick. */
#define REDISMODULE_EXPERIMENTAL_API
#include "redismodule.h" /* from the redis-module crate: bench/floor/measure */
#include <string.h>
#include <errno.h>

static int check_acl = 0;
static int same_work = 0;
static RedisModuleTimerID wait_timer = 0;
static long long next_lease_end = 0;
static void on_timer(RedisModuleCtx *ctx, void *data) { (void)ctx; (void)data; wait_timer = 0; }
static void on_event(RedisModuleCtx *ctx, RedisModuleEvent e, uint64_t sub, void *data) {
    (void)ctx; (void)e; (void)sub; (void)data;
}
/* What redsem does besides the recipe's work: the derived keys looked for, the event. */
static void work_of_call(RedisModuleCtx *ctx, RedisModuleString *name, const char *event) {
    if (!same_work) return;
    size_t len; const char *p = RedisModule_StringPtrLen(name, &len);
    const char *suf[3] = {":owner", ":permits", ":limit"};
    for (int i = 0; i < 3; i++) {
        char buf[256]; size_t sl = strlen(suf[i]);
        memcpy(buf, p, len); memcpy(buf + len, suf[i], sl);
        RedisModuleString *k = RedisModule_CreateString(ctx, buf, len + sl);
        (void)RedisModule_KeyExists(ctx, k);
        RedisModule_FreeString(ctx, k);
    }
    if (event) RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, event, name);
}
/* A wait starts: its timer, the next lease end, the server events followed. */
static void work_of_wait(RedisModuleCtx *ctx, RedisModuleKey *key, long long now, long long wait_ms) {
    if (!same_work) return;
    wait_timer = RedisModule_CreateTimer(ctx, wait_ms, on_timer, NULL);
    if (RedisModule_ZsetFirstInScoreRange(key, (double)now, REDISMODULE_POSITIVE_INFINITE, 1, 0) == REDISMODULE_OK) {
        double score;
        RedisModuleString *m = RedisModule_ZsetRangeCurrentElement(key, &score);
        if (m) { next_lease_end = (long long)score; RedisModule_FreeString(ctx, m); }
        RedisModule_ZsetRangeStop(key);
    }
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_FlushDB, on_event);
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_SwapDB, on_event);
}
/* The wait is served: its timer stopped, the events it needed ended. */
static void work_of_serve(RedisModuleCtx *ctx) {
    if (!same_work) return;
    if (wait_timer) RedisModule_StopTimer(ctx, wait_timer, NULL);
    wait_timer = 0;
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_FlushDB, NULL);
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_SwapDB, NULL);
}
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
    work_of_call(ctx, argv[1], NULL);
    if ((long long)RedisModule_ValueLength(key) >= limit) {
        long long wait_ms;
        if (argc == 6 && !waiter && RedisModule_StringToLongLong(argv[5], &wait_ms) == REDISMODULE_OK) {
            work_of_wait(ctx, key, now, wait_ms);
            RedisModule_CloseKey(key);
            if (waiter_id) RedisModule_FreeString(NULL, waiter_id);
            if (waiter_name) RedisModule_FreeString(NULL, waiter_name);
            RedisModule_RetainString(NULL, argv[4]); waiter_id = argv[4];
            RedisModule_RetainString(NULL, argv[1]); waiter_name = argv[1];
            waiter_lease = lease;
            waiter = RedisModule_BlockClient(ctx, grant_reply, timeout_reply, free_data, wait_ms);
            return REDISMODULE_OK;
        }
        RedisModule_CloseKey(key);
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
    if (same_work) RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "sem.acquire", argv[1]);
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
    if (same_work) RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "sem.acquire", waiter_name);
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithString(ctx, id);
}
static int timeout_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    waiter = NULL;
    work_of_serve(ctx);
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
    work_of_call(ctx, argv[1], NULL);
    if (type == REDISMODULE_KEYTYPE_ZSET) {
        RedisModule_ZsetRem(key, argv[2], &deleted);
        if (deleted) RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], argv[2]);
        if (deleted && same_work) RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "sem.release", argv[1]);
    }
    RedisModule_CloseKey(key);
    if (deleted && waiter) {
        RedisModuleBlockedClient *bc = waiter;
        waiter = NULL;
        work_of_serve(ctx);
        RedisModule_UnblockClient(bc, waiter_id);
    }
    return RedisModule_ReplyWithLongLong(ctx, deleted);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (RedisModule_Init(ctx, "csem", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    if (argc >= 1) { long long v; if (RedisModule_StringToLongLong(argv[0], &v) == REDISMODULE_OK) check_acl = (int)v; }
    if (argc >= 2) { long long v; if (RedisModule_StringToLongLong(argv[1], &v) == REDISMODULE_OK) same_work = (int)v; }
    if (RedisModule_CreateCommand(ctx, "csem.acquire", acquire, "write deny-oom", 1, 1, 1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "csem.release", release, "write", 1, 1, 1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
