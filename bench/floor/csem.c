/* The floor of a plain acquire/release pair as a minimal C module: the non-fair recipe's work
 * (prune expired holders, count, add, move the key's expiry) and a release, with the effects
 * replicated one command per change, as a module must when it reads the clock. With ACL=1 the
 * command also checks the caller's user on four derived keys, as a module without a command
 * filter must. With WORK=1 (the second argument) it also does the rest of what redsem does around
 * the same calls, in C: a look for the three keys a semaphore may have besides its holders, the
 * keyspace events Redis's own commands fire for each change (zadd, zrem, del when a set empties,
 * expire, set) and a `sem.acquire`/`sem.release` event, and for a wait its own timer for the
 * wait's end, the next lease end looked up, the flush and swap server events followed while it
 * waits (ended when it is served), and other clients' deletes followed: on Redis before 7.2,
 * from the first wait on and for good (7.0 cannot unsubscribe), the generic, expired and evicted
 * keyspace events, each key's name hashed and looked up in a filter of the waited names. As redsem
 * does, WORK=1 ends a wait by its own timer alone (the blocked client has no Redis timeout), keeps
 * the four derived names of the last semaphore and hands them out again (the ACL check, the look
 * for the other keys and the fair recipe's keys use the same strings), looks for `:owner` and
 * `:permits` on release (not `:limit`), and skips its own writes' events in the keyspace callback
 * (a flag set around its own notifications, no hash).
 * CSEM.ACQUIREFAIR is the fair recipe: holders `<name>` scored by lease end, owners
 * `<name>:owner` scored by ticket, the counter `<name>:counter`; an acquire prunes expired
 * holders from both sets, and a grant takes the ticket max(counter + 1, now in ms * 1000),
 * writes the counter and adds the holder to both sets, each change replicated. CSEM.RELEASE also
 * removes the holder from `<name>:owner` where that exists (without WORK, once a fair acquire
 * has been seen since load). Not part of the project: a measuring stick. */
#define REDISMODULE_EXPERIMENTAL_API
#include "redismodule.h" /* from the redis-module crate: bench/floor/measure */
#include <string.h>
#include <errno.h>
#include <stdint.h>

static int check_acl = 0;
static int same_work = 0;
static int fair_seen = 0;
/* Set while the module fires its own writes' events: the keyspace callback skips them. */
static int own_write = 0;
static void notify(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *name) {
    own_write = 1;
    RedisModule_NotifyKeyspaceEvent(ctx, type, event, name);
    own_write = 0;
}
/* A keyspace event as Redis's own command would fire it for the same change (WORK=1). */
static void ev(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *name) {
    if (same_work) notify(ctx, type, event, name);
}
/* After a member removed from `key`: zrem, and del when that emptied and deleted the key. */
static void ev_zrem(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleString *name) {
    if (!same_work) return;
    notify(ctx, REDISMODULE_NOTIFY_ZSET, "zrem", name);
    if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_EMPTY)
        notify(ctx, REDISMODULE_NOTIFY_GENERIC, "del", name);
}
/* The waited names, as a filter of their hashes (2^16 bits) that the keyspace callback reads. */
static uint64_t waited[1024];
static long long followed = 0;
static int keys_followed = 0;
static uint64_t name_bit(const char *p, size_t len) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ULL; }
    return h & 0xffff;
}
static int waited_on(const char *p, size_t len) {
    uint64_t b = name_bit(p, len);
    return (int)((waited[b >> 6] >> (b & 63)) & 1);
}
static const char *derived[4] = {":owner", ":counter", ":permits", ":limit"};
/* Another client's delete, expiry or eviction: a waited semaphore's key, or one of its derived
 * keys, is counted; any other key costs a hash and a load. */
static int on_key(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *key) {
    (void)ctx; (void)type; (void)event;
    if (own_write) return REDISMODULE_OK;
    size_t len; const char *p = RedisModule_StringPtrLen(key, &len);
    int hit = waited_on(p, len);
    if (!hit && len && (p[len - 1] == 'r' || p[len - 1] == 's' || p[len - 1] == 't'))
        for (int i = 0; i < 4 && !hit; i++) {
            size_t sl = strlen(derived[i]);
            hit = len > sl && !memcmp(p + len - sl, derived[i], sl) && waited_on(p, len - sl);
        }
    if (hit) followed++;
    return REDISMODULE_OK;
}
static RedisModuleString *derived_name(RedisModuleCtx *ctx, RedisModuleString *name, const char *suffix) {
    size_t len; const char *p = RedisModule_StringPtrLen(name, &len);
    char buf[256]; size_t sl = strlen(suffix);
    memcpy(buf, p, len); memcpy(buf + len, suffix, sl);
    return RedisModule_CreateString(ctx, buf, len + sl);
}
/* WORK=1: the derived names of the last semaphore named (`:owner`, `:counter`, `:permits`,
 * `:limit`), built once and handed out again while the same name comes back. */
static RedisModuleString *names[4];
static char names_of[256];
static size_t names_len = 0;
static RedisModuleString **names_for(RedisModuleString *name) {
    size_t len; const char *p = RedisModule_StringPtrLen(name, &len);
    if (names[0] && len == names_len && !memcmp(p, names_of, len)) return names;
    for (int i = 0; i < 4; i++) {
        if (names[i]) RedisModule_FreeString(NULL, names[i]);
        names[i] = derived_name(NULL, name, derived[i]);
    }
    memcpy(names_of, p, len); names_len = len;
    return names;
}
/* `<name>:owner`: the kept string (WORK=1) or a new one, which drop_name frees. */
static RedisModuleString *owner_name(RedisModuleCtx *ctx, RedisModuleString *name) {
    return same_work ? names_for(name)[0] : derived_name(ctx, name, ":owner");
}
static void drop_name(RedisModuleCtx *ctx, RedisModuleString *s) {
    if (!same_work) RedisModule_FreeString(ctx, s);
}
static RedisModuleTimerID wait_timer = 0;
static long long next_lease_end = 0;
static void work_of_serve(RedisModuleCtx *ctx);
static RedisModuleBlockedClient *waiter;
/* WORK=1: the wait's end, its only one (the blocked client has no Redis timeout): nil. */
static void on_timer(RedisModuleCtx *ctx, void *data) {
    (void)data;
    wait_timer = 0;
    if (!waiter) return;
    RedisModuleBlockedClient *bc = waiter;
    waiter = NULL;
    work_of_serve(ctx);
    RedisModule_UnblockClient(bc, NULL);
}
static void on_event(RedisModuleCtx *ctx, RedisModuleEvent e, uint64_t sub, void *data) {
    (void)ctx; (void)e; (void)sub; (void)data;
}
/* What redsem does besides the recipe's work: the derived keys looked for (`:owner`, `:permits`,
 * and on an acquire `:limit`). Which of them exist (bit 0: `:owner`). */
static int work_of_call(RedisModuleCtx *ctx, RedisModuleString *name, int acquire) {
    if (!same_work) return 0;
    int found = 0;
    RedisModuleString **n = names_for(name);
    if (RedisModule_KeyExists(ctx, n[0])) found |= 1;
    if (RedisModule_KeyExists(ctx, n[2])) found |= 2;
    if (acquire && RedisModule_KeyExists(ctx, n[3])) found |= 4;
    return found;
}
/* A wait starts: its timer, the next lease end, the server events followed, the name in the
 * filter, and from the first wait on other clients' deletes followed (for good: Redis 7.0
 * cannot unsubscribe; 7.2 and later would follow the key server event instead). */
static void work_of_wait(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleString *name, long long now, long long wait_ms) {
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
    size_t len; const char *p = RedisModule_StringPtrLen(name, &len);
    uint64_t b = name_bit(p, len);
    waited[b >> 6] |= 1ULL << (b & 63);
    if (!keys_followed) {
        keys_followed = 1;
        if (!RedisModule_GetServerVersion || RedisModule_GetServerVersion() < 0x00070200)
            RedisModule_SubscribeToKeyspaceEvents(ctx, REDISMODULE_NOTIFY_GENERIC|REDISMODULE_NOTIFY_EXPIRED|REDISMODULE_NOTIFY_EVICTED, on_key);
    }
}
static RedisModuleString *waiter_name;
/* The wait is served: its timer stopped, the events it needed ended, the name out of the filter. */
static void work_of_serve(RedisModuleCtx *ctx) {
    if (!same_work) return;
    if (wait_timer) RedisModule_StopTimer(ctx, wait_timer, NULL);
    wait_timer = 0;
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_FlushDB, NULL);
    RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_SwapDB, NULL);
    if (waiter_name) {
        size_t len; const char *p = RedisModule_StringPtrLen(waiter_name, &len);
        uint64_t b = name_bit(p, len);
        waited[b >> 6] &= ~(1ULL << (b & 63));
    }
}
static RedisModuleString *waiter_id = NULL, *waiter_name = NULL;
static long long waiter_lease = 0;
static int waiter_fair = 0;
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
    if (same_work) {
        RedisModuleString **n = names_for(name);
        int ok = 1;
        for (int i = 0; i < 4 && ok; i++)
            ok = RedisModule_ACLCheckKeyPermissions(u, n[i], REDISMODULE_CMD_KEY_ACCESS|REDISMODULE_CMD_KEY_UPDATE|REDISMODULE_CMD_KEY_INSERT|REDISMODULE_CMD_KEY_DELETE) == REDISMODULE_OK;
        RedisModule_FreeModuleUser(u);
        return ok;
    }
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

/* One member added, replicated, with its event. */
static void add(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleString *name, long long score, RedisModuleString *id) {
    int flags = 0;
    RedisModule_ZsetAdd(key, (double)score, id, &flags);
    RedisModule_Replicate(ctx, "ZADD", "sls", name, score, id);
    ev(ctx, REDISMODULE_NOTIFY_ZSET, "zadd", name);
}
/* The key's expiry moved to `deadline` when that is later, replicated, with its event. */
static void expire_to(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleString *name, long long deadline) {
    if (RedisModule_GetAbsExpire(key) >= deadline) return;
    RedisModule_SetAbsExpire(key, deadline);
    RedisModule_Replicate(ctx, "PEXPIREAT", "sl", name, deadline);
    ev(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", name);
}
/* A plain grant: the holder added by lease end, the key's expiry moved. */
static void plain_grant(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleString *name, RedisModuleString *id, long long deadline) {
    add(ctx, key, name, deadline, id);
    expire_to(ctx, key, name, deadline);
    if (same_work) notify(ctx, REDISMODULE_NOTIFY_MODULE, "sem.acquire", name);
}
/* The caller waits (one waiter at a time): `argv` is the acquire's. */
static void start_wait(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleString **argv, long long now,
                       long long lease, int fair, long long wait_ms) {
    work_of_wait(ctx, key, argv[1], now, wait_ms);
    RedisModule_CloseKey(key);
    if (waiter_id) RedisModule_FreeString(NULL, waiter_id);
    if (waiter_name) RedisModule_FreeString(NULL, waiter_name);
    RedisModule_RetainString(NULL, argv[4]); waiter_id = argv[4];
    RedisModule_RetainString(NULL, argv[1]); waiter_name = argv[1];
    waiter_lease = lease;
    waiter_fair = fair;
    /* WORK=1: the module's timer (armed in work_of_wait) is the wait's one end. */
    waiter = RedisModule_BlockClient(ctx, grant_reply, timeout_reply, free_data, same_work ? 0 : wait_ms);
}

/* An acquire's arity, numbers and ACL; false once it replied with the error. */
static int acquire_args(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, long long *limit, long long *lease) {
    if (argc != 5 && argc != 6) return RedisModule_WrongArity(ctx), 0;
    if (RedisModule_StringToLongLong(argv[2], limit) != REDISMODULE_OK ||
        RedisModule_StringToLongLong(argv[3], lease) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, "ERR bad number"), 0;
    if (!acl_ok(ctx, argv[1])) return RedisModule_ReplyWithError(ctx, "NOPERM"), 0;
    return 1;
}

/* CSEM.ACQUIRE name limit lease_ms id */
static int acquire(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long limit, lease;
    if (!acquire_args(ctx, argv, argc, &limit, &lease)) return REDISMODULE_OK;
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
            ev_zrem(ctx, key, argv[1]);
            RedisModule_FreeString(ctx, m);
        }
        RedisModule_ZsetRangeStop(key);
    }
    work_of_call(ctx, argv[1], 1);
    if ((long long)RedisModule_ValueLength(key) >= limit) {
        long long wait_ms;
        if (argc == 6 && !waiter && RedisModule_StringToLongLong(argv[5], &wait_ms) == REDISMODULE_OK) {
            start_wait(ctx, key, argv, now, lease, 0, wait_ms);
            return REDISMODULE_OK;
        }
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithNull(ctx);
    }
    plain_grant(ctx, key, argv[1], argv[4], now + lease);
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithString(ctx, argv[4]);
}

/* A fair grant: the ticket from the counter, the counter written, the holder added to the owners
 * by ticket and to the holders by lease end, both sets' expiry moved to the latest lease end. */
static void fair_grant(RedisModuleCtx *ctx, RedisModuleKey *key, RedisModuleKey *owner, RedisModuleString *name,
                       RedisModuleString *oname, RedisModuleString *id, long long deadline, long long now) {
    RedisModuleString *cname = same_work ? names_for(name)[1] : derived_name(ctx, name, ":counter");
    RedisModuleKey *ck = RedisModule_OpenKey(ctx, cname, REDISMODULE_READ|REDISMODULE_WRITE);
    long long counter = 0;
    size_t len;
    if (RedisModule_KeyType(ck) == REDISMODULE_KEYTYPE_STRING) {
        const char *p = RedisModule_StringDMA(ck, &len, REDISMODULE_READ);
        for (size_t i = 0; i < len && p[i] >= '0' && p[i] <= '9'; i++) counter = counter * 10 + (p[i] - '0');
    }
    long long ticket = counter + 1;
    if (ticket < now * 1000) ticket = now * 1000;
    char buf[24], *b = buf + sizeof buf;
    for (long long t = ticket; b == buf + sizeof buf || t; t /= 10) *--b = (char)('0' + t % 10);
    size_t n = (size_t)(buf + sizeof buf - b);
    RedisModule_StringTruncate(ck, n);
    char *w = RedisModule_StringDMA(ck, &len, REDISMODULE_WRITE);
    if (w && len == n) memcpy(w, b, n);
    RedisModule_Replicate(ctx, "SET", "sbc", cname, b, n, "KEEPTTL");
    ev(ctx, REDISMODULE_NOTIFY_STRING, "set", cname);
    RedisModule_CloseKey(ck);
    if (!same_work) RedisModule_FreeString(ctx, cname);
    add(ctx, owner, oname, ticket, id);
    add(ctx, key, name, deadline, id);
    expire_to(ctx, owner, oname, deadline);
    expire_to(ctx, key, name, deadline);
    if (same_work) notify(ctx, REDISMODULE_NOTIFY_MODULE, "sem.acquire", name);
}

/* CSEM.ACQUIREFAIR name limit lease_ms id [wait_ms] */
static int acquire_fair(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long limit, lease;
    if (!acquire_args(ctx, argv, argc, &limit, &lease)) return REDISMODULE_OK;
    fair_seen = 1;
    long long now = RedisModule_Milliseconds();
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ|REDISMODULE_WRITE);
    RedisModuleString *oname = owner_name(ctx, argv[1]);
    RedisModuleKey *owner = RedisModule_OpenKey(ctx, oname, REDISMODULE_READ|REDISMODULE_WRITE);
    int type = RedisModule_KeyType(key), otype = RedisModule_KeyType(owner);
    if ((type != REDISMODULE_KEYTYPE_EMPTY && type != REDISMODULE_KEYTYPE_ZSET) ||
        (otype != REDISMODULE_KEYTYPE_EMPTY && otype != REDISMODULE_KEYTYPE_ZSET)) {
        RedisModule_CloseKey(owner); RedisModule_CloseKey(key); drop_name(ctx, oname);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    if (type == REDISMODULE_KEYTYPE_ZSET) {
        /* Prune expired holders from both sets, each removal one effect. */
        RedisModule_ZsetFirstInScoreRange(key, REDISMODULE_NEGATIVE_INFINITE, (double)now, 0, 0);
        while (!RedisModule_ZsetRangeEndReached(key)) {
            double score;
            int deleted = 0;
            RedisModuleString *m = RedisModule_ZsetRangeCurrentElement(key, &score);
            RedisModule_ZsetRangeNext(key);
            RedisModule_ZsetRem(key, m, NULL);
            RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], m);
            ev_zrem(ctx, key, argv[1]);
            RedisModule_ZsetRem(owner, m, &deleted);
            if (deleted) {
                RedisModule_Replicate(ctx, "ZREM", "ss", oname, m);
                ev_zrem(ctx, owner, oname);
            }
            RedisModule_FreeString(ctx, m);
        }
        RedisModule_ZsetRangeStop(key);
    }
    work_of_call(ctx, argv[1], 1);
    if ((long long)RedisModule_ValueLength(key) >= limit) {
        long long wait_ms;
        RedisModule_CloseKey(owner);
        drop_name(ctx, oname);
        if (argc == 6 && !waiter && RedisModule_StringToLongLong(argv[5], &wait_ms) == REDISMODULE_OK) {
            start_wait(ctx, key, argv, now, lease, 1, wait_ms);
            return REDISMODULE_OK;
        }
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithNull(ctx);
    }
    fair_grant(ctx, key, owner, argv[1], oname, argv[4], now + lease, now);
    RedisModule_CloseKey(owner);
    RedisModule_CloseKey(key);
    drop_name(ctx, oname);
    return RedisModule_ReplyWithString(ctx, argv[4]);
}

/* One waiter at a time is enough for the floor of a hand-off: the blocked client, its id and
 * lease, and the name. */

/* The waiter's reply: it is granted now, in the releaser's wake (key work and effects here). */
static int grant_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    RedisModuleString *id = RedisModule_GetBlockedClientPrivateData(ctx);
    if (!id) return RedisModule_ReplyWithNull(ctx); /* the module's timer ended the wait */
    if (waiter_fair) {
        long long now = RedisModule_Milliseconds();
        RedisModuleKey *key = RedisModule_OpenKey(ctx, waiter_name, REDISMODULE_READ|REDISMODULE_WRITE);
        RedisModuleString *oname = owner_name(ctx, waiter_name);
        RedisModuleKey *owner = RedisModule_OpenKey(ctx, oname, REDISMODULE_READ|REDISMODULE_WRITE);
        fair_grant(ctx, key, owner, waiter_name, oname, id, now + waiter_lease, now);
        RedisModule_CloseKey(owner);
        RedisModule_CloseKey(key);
        drop_name(ctx, oname);
        return RedisModule_ReplyWithString(ctx, id);
    }
    RedisModuleKey *key = RedisModule_OpenKey(ctx, waiter_name, REDISMODULE_READ|REDISMODULE_WRITE);
    plain_grant(ctx, key, waiter_name, id, RedisModule_Milliseconds() + waiter_lease);
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
    int found = work_of_call(ctx, argv[1], 0);
    if (type == REDISMODULE_KEYTYPE_ZSET) {
        RedisModule_ZsetRem(key, argv[2], &deleted);
        if (deleted) RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], argv[2]);
        if (deleted) ev_zrem(ctx, key, argv[1]);
    }
    if (same_work ? (found & 1) : fair_seen) {
        /* A fair semaphore's: the owner goes too. */
        RedisModuleString *oname = owner_name(ctx, argv[1]);
        RedisModuleKey *owner = RedisModule_OpenKey(ctx, oname, REDISMODULE_READ|REDISMODULE_WRITE);
        int odeleted = 0;
        if (RedisModule_KeyType(owner) == REDISMODULE_KEYTYPE_ZSET) {
            RedisModule_ZsetRem(owner, argv[2], &odeleted);
            if (odeleted) {
                RedisModule_Replicate(ctx, "ZREM", "ss", oname, argv[2]);
                ev_zrem(ctx, owner, oname);
            }
        }
        RedisModule_CloseKey(owner);
        drop_name(ctx, oname);
    }
    if (deleted && same_work) notify(ctx, REDISMODULE_NOTIFY_MODULE, "sem.release", argv[1]);
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
    if (RedisModule_CreateCommand(ctx, "csem.acquirefair", acquire_fair, "write deny-oom", 1, 1, 1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "csem.release", release, "write", 1, 1, 1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
