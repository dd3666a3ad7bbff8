#!lua flags=allow-oom
-- redsem.lua: the redsem semaphore operations as one server-side Lua script, for servers that
-- cannot load the redsem module (managed Redis services; Redis 7.0 or later, Valkey). It keeps
-- the very same keys as the module, with the module's rules (src/semaphore.rs), so a semaphore
-- started with this script goes on unchanged once the module is loaded. Every package (Python,
-- Node, Rust, Java, Go) ships a copy of this one file.
--
-- Two texts of it are loaded: this file as it is (first line `#!lua flags=allow-oom`), which
-- runs when memory is full, and the same with that first line replaced by `#!lua`, which the
-- server refuses at `maxmemory` with its own OOM error, changing nothing. A package sends an
-- acquire that may take a new place (its first attempt) with the second and every other call
-- with the first, so a refresh, a release and a waiter already in line work when memory is
-- full, as the module's do, and a newcomer is refused there with the module's error.
--
-- Call (OP is case-insensitive):
--
--   EVALSHA <sha1 of the text> 6 <name> <name>:owner <name>:counter <name>:permits
--           <name>:limit <name>:wake <OP> [args...]
--
-- (on NOSCRIPT, `EVAL <the text> 6 ...` once, which also loads it).
--
--   ACQUIRE <limit> <lease> ID <id> [COUNT <n>] [LINE]
--   ACQUIREFAIR <limit> <lease> ID <id> [COUNT <n>] [WITHTICKET] [LINE]
--       SEM.ACQUIRE / SEM.ACQUIREFAIR without WAIT and BOUND. Replies [reply, retry_ms, ahead]:
--       reply is the module's reply (the id; [id, ticket] with WITHTICKET; nil when refused);
--       when refused, retry_ms is the milliseconds until the earliest live holder's deadline
--       (0 when no holder is live) and ahead the number of waiters in line before the caller
--       (with LINE) or in the line (without); ahead = -1: the module is loaded, the reply is
--       its own (SEM.ACQUIRE's, without WAIT), and the caller should use the module from now on.
--       LINE: a refused caller takes (or keeps) its place at the end of the semaphore's line,
--       held for PLACE_MS from this call; see "The line" below.
--   REFRESH <id> <lease>         -> integer, as SEM.REFRESH
--   RELEASE <id> [COUNT <k>]     -> integer, as SEM.RELEASE
--   GET                          -> integer, as SEM.GET (permits in use)
--   LIMIT | LIMIT <n> | LIMIT CLEAR -> as SEM.LIMIT (nil or n; OK; 1 or 0)
--   TICK                         -> integer: serves the line at the server's clock now (a lease
--                                   that ran out frees its permits), then the milliseconds
--                                   until the earliest live holder's deadline (0: none)
--   LEAVE <id>                   -> the caller leaves the line: nil, or the message of a grant
--                                   made to it before it left (see below), which it now holds
--                                   (a grant's "G" only while that holder is live)
--
-- Keys, as the module keeps them: <name> (sorted set: id -> deadline, Unix ms), <name>:owner
-- (fair: id -> ticket), <name>:counter (fair: the last ticket), <name>:permits (hash: the
-- permits of holders of more than one, and the "" field = permits held beyond one per holder),
-- <name>:limit (an operator's limit, 0 pauses). <name>, <name>:owner and <name>:permits expire
-- at the latest deadline; no key is ever left empty. Arguments, validation order and error
-- texts are the module's (sem.max-lease at its default, one year). The clock is the server's
-- (TIME). Fair tickets are max(counter + 1, the clock in microseconds), on the scale of the
-- module's fencing floor (ms * 1000): a name whose keys went (DEL, FLUSHDB) starts again from
-- the clock, and would repeat a ticket only for two grants within one microsecond.
--
-- The line (this script's own keys, all in the name's slot): <name>:line (sorted set: waiter
-- id -> arrival number), <name>:places (hash: waiter id -> "deadline kind limit lease_ms count",
-- its place's deadline and what it asked for) and <name>:wake:<id> (a list per waiter). Every
-- call that may free permits (a release, a refresh or acquire that finds expired holders, a
-- stored limit raised or cleared, TICK, LEAVE) first serves the line: the first waiter whose
-- place is still held is granted, if it fits, with its own limit, lease (starting then, by the
-- server's clock), count and kind, and leaves the line; then the next, and so on; nobody behind
-- a waiter that does not fit is served before it. A waiter whose place ran out (it stopped
-- renewing: it died) is dropped when it reaches the head. The grant is pushed to the waiter's
-- list as a message, which it takes with `BLPOP <name>:wake:<id>`:
--   "G"          a plain grant;             "G<ticket>"   a fair grant and its ticket;
--   "E<error>"   its grant failed with that error (it is out of the line);
--   "H<ms>"      it is now first in line and a holder's lease ends in <ms> milliseconds, within
--                NUDGE_MS: call TICK then (a package that knows only "H" tries again, which
--                tells it when);
--   "M"          the module is loaded: use it (the line is given up).
-- A refused ACQUIRE without LINE changes nothing but the expired holders it removes; a plain one
-- may take a free permit ahead of the line (as SEM.ACQUIRE without WAIT does), a fair one is
-- refused while anyone waits. A caller that holds a live permit renews it, waiting or not.
-- Each attempt with LINE empties the caller's list, whether granted or refused: every
-- message a waiter takes was told after its last attempt, so the lease of a grant told started
-- after that attempt was sent (a grant whose lease ran out before the waiter came back is gone
-- with it).
-- Lists and the line expire PLACE_MS after their last write: nothing lingers.
--
-- The module loaded later: every call first asks the server whether SEM.ACQUIRE exists; when it
-- does, the call is the module's command (long form), so a release or refresh sent through the
-- script serves the module's waiters at once, and the line's waiters are told "M".
--
-- What scripts do not do, unlike the module:
--   - WAIT inside the server: the packages wait with LINE, BLPOP and TICK.
--   - BOUND (permits that end with the connection), SEM.ACQUIREALL / RELEASEALL / REFRESHALL,
--     SEM.WAITEMPTY, SEM.GET JSON, and identifiers made by the server (ID is required).
--   - sem.* configuration (max-lease, waiter limits), INFO sem, sem.* keyspace events, the
--     fencing floor kept across failovers (the floor here is the clock at each grant).
--   - Redis Cluster: the keys must share a slot, so the name needs a hash tag ({name}).

local MAX_LIMIT = 4294967295
local MAX_LEASE_MS = 31536000000 -- one year, the module's default sem.max-lease
local MAX_TICKET = 9007199254740992 -- 2^53: sorted-set scores hold integers exactly up to it
local MAX_TICKET_TEXT = '9007199254740992'
-- A waiter's place in line is held this long after its last attempt; the packages try again
-- at least every NUDGE_MS (their longest BLPOP), so a live waiter never loses its place.
local PLACE_MS = 6000
local PLACE_MS_TEXT = '6000'
local NUDGE_MS = 2500
-- The most waiters one call serves or drops, and tells of the module (the rest: the next call).
local SERVE_MAX = 100
local FLUSH_MAX = 1000

local NAME, OWNER, COUNTER, PERMITS, LIMIT, WAKE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local LINE, PLACES = NAME .. ':line', NAME .. ':places'

------------------------------------------------------------------------------------------------
-- The quick path. Making the full routines below costs more than the calls they make (Lua
-- makes a closure of each at every call), so the calls packages make most — an acquire with ID
-- and maybe WITHTICKET or LINE, a release without COUNT, TICK — are first tried here, on a
-- semaphore in its usual state: its keys of their types, no weights, no stored limit, owners
-- that match the holders, no renewal and no weighted waiter at the head. The quick path reads
-- and plans first; anything else it meets leaves it (`break`) with nothing written, and the
-- full routines take the call. Both paths answer alike and leave the same keys, values and
-- expiries (tests/scripts_backend.rs runs random sequences through each and compares); the
-- quick one may also set an expiry equal to a key's own on a key the call already wrote, one
-- more `expire` event where the key changed anyway. QUICK = false turns this one off.
--
-- It runs in the script's body rather than a function, with two routines only: at every call
-- Lua makes each closure anew, and a cell for each outer local it reads, which cost more than
-- the Lua they save.
local QUICK = true

-- An integer as Redis reads it, without the float formatting of '%.0f' where '%d' is exact.
local function int(n)
  if n > -MAX_TICKET and n < MAX_TICKET and n == math.floor(n) then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

while QUICK do -- one pass; `break` hands the call to the full routines
  if NAME == '' or #KEYS ~= 6 or OWNER ~= NAME .. ':owner' or COUNTER ~= NAME .. ':counter'
    or PERMITS ~= NAME .. ':permits' or LIMIT ~= NAME .. ':limit' or WAKE ~= NAME .. ':wake' then
    break
  end
  local call = redis.call
  local op, nargs = ARGV[1], #ARGV
  local kind, id, limit, lease_ms, with_ticket, line
  if op == 'ACQUIRE' or op == 'ACQUIREFAIR' then
    kind = op == 'ACQUIRE' and 'plain' or 'fair'
    local text = ARGV[2]
    if not text or #text > 10 or not text:find('^[1-9]%d*$') then
      break
    end
    limit = tonumber(text)
    local whole, fraction = (ARGV[3] or ''):match('^(%d+)%.?(%d*)$')
    if not whole or #whole > 9 or #fraction > 3 or (fraction == '' and ARGV[3]:find('%.')) then
      break
    end
    lease_ms = tonumber(whole) * 1000
    if fraction ~= '' then
      lease_ms = lease_ms + tonumber(fraction) * ({ 100, 10, 1 })[#fraction]
    end
    if limit > MAX_LIMIT or lease_ms < 1 or lease_ms > MAX_LEASE_MS then
      break
    end
    local i = 4
    while i <= nargs do
      local option = ARGV[i]
      if option == 'ID' and not id and ARGV[i + 1] and ARGV[i + 1] ~= '' then
        id = ARGV[i + 1]
        i = i + 2
      elseif option == 'WITHTICKET' and kind == 'fair' and not with_ticket then
        with_ticket = true
        i = i + 1
      elseif option == 'LINE' and not line then
        line = true
        i = i + 1
      else
        id = nil -- an option the full routines parse
        break
      end
    end
    if not id then
      break
    end
  elseif op == 'RELEASE' and nargs == 2 and ARGV[2] ~= '' then
    id = ARGV[2]
  elseif op ~= 'TICK' or nargs ~= 1 then
    break
  end
  local caller = op ~= 'RELEASE' and id or nil -- the call whose grant the line returns
  if call('COMMAND', 'INFO', 'SEM.ACQUIRE')[1] then
    break
  end
  -- The state: every key of its type (a pcall answers an error table for WRONGTYPE), no
  -- weights, no stored limit, and no places without a line (with one, the places are read at
  -- its head). Up to 9 holders and the first 2 waiters are read at once; a count is asked only
  -- when there are more.
  local list, owners = redis.pcall('ZRANGE', NAME, '0', '8', 'WITHSCORES'),
    redis.pcall('ZCARD', OWNER)
  local heads = redis.pcall('ZRANGE', LINE, '0', '1')
  if list.err or type(owners) ~= 'number' or heads.err then
    break
  end
  local holders = #list < 18 and #list / 2 or call('ZCARD', NAME)
  local waiting = #heads < 2 and #heads or call('ZCARD', LINE)
  if (waiting == 0 and call('EXISTS', PERMITS, LIMIT, PLACES) ~= 0)
    or (waiting > 0 and call('EXISTS', PERMITS, LIMIT) ~= 0) then
    break
  end
  local time = call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local now_text = int(now)
  -- The expired holders. Up to 8 holders are read whole (`alive`: each live one's deadline, as
  -- the call changes them; `scores`: every one's score); of more, the earliest deadline after
  -- now while it is known (nil: none): with no holder expired, the first one's. The replies'
  -- retry_ms, whether a waiter holds and the expiry's latest deadline need no query then.
  local expired, first_score, first_live, first_known = {}, nil, nil, true
  local alive, scores
  if holders <= 8 then
    alive, scores = {}, {}
    for i = 1, #list, 2 do
      local member, score = list[i], tonumber(list[i + 1])
      scores[member] = list[i + 1]
      if score <= now then
        expired[#expired + 1] = member
      else
        alive[member] = math.ceil(score)
      end
    end
  else
    first_score = list[2]
    if tonumber(first_score) > now then
      first_live = math.ceil(tonumber(first_score))
    else
      expired = call('ZRANGEBYSCORE', NAME, '-inf', now_text)
      first_known = false
      if #expired > 1000 then
        break
      end
    end
  end
  local live = holders - #expired
  local sem_kind, leftovers
  if owners == 0 then
    sem_kind = live > 0 and 'plain' or nil
  elseif live == 0 then
    leftovers = true
  else
    local expired_owners = 0
    if #expired > 0 then
      for _, score in ipairs(call('ZMSCORE', OWNER, unpack(expired))) do
        if score then
          expired_owners = expired_owners + 1
        end
      end
    end
    if owners - expired_owners ~= live then
      break -- another client wrote the owner set
    end
    sem_kind = 'fair'
  end
  local own = false -- the caller's score as a holder
  if scores then
    own = id and scores[id] or false
  elseif id then
    own = call('ZSCORE', NAME, id)
  end
  if own and op ~= 'RELEASE' then
    break -- a renewal
  end
  local release_live = own and math.ceil(tonumber(own)) > now
  if release_live then
    live = live - 1
    if alive then
      alive[id] = nil
    elseif own == first_score then
      first_known = false -- the earliest goes: the next is not known
    end
  end

  -- The plan, read only: the line from its head, two waiters and then eight at a time, each
  -- dropped (its place ran out or is not one) or granted up to the one where serving stops
  -- (`head`; nil: the line ran out); then the caller, when its rule applies. One copy of the
  -- rule serves both, as a routine would cost more than it does (see above).
  local pruned, last_ticket, bail, latest_grant = false, nil, false, nil
  local served, mine, head, grant = {}, nil, nil, nil
  local places, held, fetched, base, k = nil, nil, 0, 0, 0
  local in_line, turn, asked = waiting > 0, nil, false
  while true do
    local who, want, most, ms
    if in_line then
      k = k + 1
      if k > SERVE_MAX then
        bail = true -- more than SERVE_MAX to serve: the full path looks again
        break
      end
      if k > fetched then
        if fetched > 0 and fetched < waiting then
          heads = call('ZRANGE', LINE, int(fetched), int(fetched + 7))
        end
        if fetched >= waiting or #heads == 0 then
          in_line, head = false, nil
        else
          places = redis.pcall('HMGET', PLACES, unpack(heads))
          if places.err then
            bail = true
            break
          end
          if not scores then
            held = call('ZMSCORE', NAME, unpack(heads))
          end
          base, fetched = fetched, fetched + #heads
        end
      end
    end
    if in_line then
      head = heads[k - base]
      local place, at, count = places[k - base], nil, nil
      if place then
        at, want, most, ms, count = place:match('^(%d+) (%a+) (%d+) (%d+) (%d+)$')
      end
      if at then
        at, most, ms, count = tonumber(at), tonumber(most), tonumber(ms), tonumber(count)
      end
      local holds
      if scores then
        holds = scores[head]
      else
        holds = held[k - base]
      end
      if not at or (want ~= 'plain' and want ~= 'fair') or most < 1 or most > MAX_LIMIT
        or ms < 1 or ms > MAX_LEASE_MS or count > most or at <= now then
        served[#served + 1] = { drop = head }
      elseif count > 0 or holds then
        bail = true -- a weighted waiter, or one that holds already
        break
      else
        who, turn = head, 'line'
      end
    elseif caller and not asked and not mine
      and (waiting == #served or (kind == 'plain' and not line)) then
      who, want, most, ms, turn, asked = id, kind, limit, lease_ms, 'caller', true
    else
      break
    end
    if who then
      -- src/semaphore.rs's acquire for a newcomer of one permit: g is a grant, false (full),
      -- 'kind' (holders of the other kind) or nil (the full path decides).
      local g
      if sem_kind and sem_kind ~= want then
        g = 'kind'
      else
        pruned = true
        if live + 1 > most then
          g = false
        else
          local ticket
          if want == 'fair' then
            if not last_ticket then
              local text = redis.pcall('GET', COUNTER)
              if not text then
                last_ticket = 0
              elseif type(text) == 'string' and (text == '0' or text:find('^[1-9]%d*$'))
                and (#text < #MAX_TICKET_TEXT
                  or (#text == #MAX_TICKET_TEXT and text <= MAX_TICKET_TEXT)) then
                last_ticket = tonumber(text)
              end
            end
            if last_ticket and last_ticket < MAX_TICKET then
              ticket = math.max(last_ticket + 1, now_us)
            end
            if not ticket or ticket > MAX_TICKET then
              bail = true
              break
            end
            last_ticket = ticket
          end
          live = live + 1
          sem_kind = want
          g = { id = who, at = now + ms, ticket = ticket, text = ticket and int(ticket) or '' }
          latest_grant = math.max(latest_grant or g.at, g.at)
          if turn == 'line' then -- the caller's own counts after the retry_ms below, as in F
            if alive then
              alive[who] = g.at
            elseif first_known and (not first_live or g.at < first_live) then
              first_live = g.at
            end
          end
        end
      end
      if turn == 'caller' then
        if g == 'kind' then
          bail = true
          break
        end
        grant = g
        break
      elseif not g or g == 'kind' then
        in_line = false -- the head stays: nobody behind it is served before it
      else
        served[#served + 1] = { drop = who, grant = g }
        if who == caller then
          mine = g
        end
      end
    end
  end
  if bail then
    break
  end
  grant = grant or mine
  local queued = waiting - #served > 0
  if op == 'RELEASE' then
    pruned = true
  end

  -- The writes, in the full path's order but the messages last. How they move <name>'s
  -- deadlines, for its expiry: 'none', 'raised' (holders only added, the latest at `added`) or
  -- 'unknown'.
  local deadlines, created, in_name = 'none', holders == 0, holders
  local owner_written = false -- the owner set changed: an expiry set on it now fires nothing new
  local gone, result = 0, nil -- holders removed
  if pruned then
    if #expired > 0 then
      call('ZREM', NAME, unpack(expired))
      if owners > 0 and call('ZREM', OWNER, unpack(expired)) > 0 then
        owner_written = true
      end
      gone = #expired
    end
    if leftovers and call('DEL', OWNER) > 0 then
      owner_written = true
    end
  end
  if op == 'RELEASE' then
    result = 0
    if release_live then
      call('ZREM', NAME, id)
      gone, result = gone + 1, 1
    end
    if owners > 0 and not leftovers and call('ZREM', OWNER, id) > 0 then
      owner_written = true
    end
  end
  if gone > 0 and holders - gone > 0 then
    deadlines = 'unknown'
  elseif gone > 0 then
    created = true
  end
  if latest_grant and deadlines == 'none' then
    deadlines = 'raised'
  end
  -- The grants: the line's, then the caller's own (after the retry_ms below).
  local puts, told = {}, {} -- told: waiters to tell and what (see "The line"), after the rest
  for _, s in ipairs(served) do
    call('ZREM', LINE, s.drop)
    call('HDEL', PLACES, s.drop)
    if s.grant then
      puts[#puts + 1] = s.grant
      if s.drop ~= caller then
        told[#told + 1] = s.drop
        told[#told + 1] = 'G' .. s.grant.text
      end
    end
  end
  local retry -- ms to the earliest live deadline once the line is served (0: none)
  for pass = 1, 2 do
    for _, g in ipairs(puts) do
      call('ZADD', NAME, int(g.at), g.id)
      if g.ticket then
        call('SET', COUNTER, g.text)
        call('ZADD', OWNER, g.text, g.id)
        owner_written = true
      end
    end
    if pass == 2 then
      break
    end
    -- A refusal's retry_ms, TICK's reply, and whether the head is nudged.
    if (#served > 0 and head and head ~= caller) or op == 'TICK' or (caller and not grant) then
      if alive then
        local first
        for _, at in pairs(alive) do
          if not first or at < first then
            first = at
          end
        end
        retry = first and first - now or 0
      elseif first_known then
        retry = first_live and first_live - now or 0
      else
        local first = call('ZRANGEBYSCORE', NAME, '(' .. now_text, '+inf', 'WITHSCORES', 'LIMIT',
          '0', '1')
        retry = #first > 0 and math.max(math.ceil(tonumber(first[2])) - now, 0) or 0
      end
      if #served > 0 and head and head ~= caller and retry > 0 and retry < NUDGE_MS then
        told[#told + 1] = head
        told[#told + 1] = 'H' .. int(retry)
      end
    end
    puts = {}
    if grant and grant ~= mine then
      puts[1] = grant
      if alive then
        alive[id] = grant.at
      end
    end
  end
  for i = 1, #told, 2 do
    local key = WAKE .. ':' .. told[i]
    if type(redis.pcall('RPUSH', key, told[i + 1])) == 'number' then
      call('PEXPIRE', key, PLACE_MS_TEXT)
    end
  end
  if caller then
    if grant then
      if queued and grant ~= mine then
        call('ZREM', LINE, id)
        call('HDEL', PLACES, id)
      end
      if queued or line then
        call('DEL', WAKE .. ':' .. id)
      end
      if with_ticket and grant.ticket then
        result = { { id, grant.ticket }, 0, 0 }
      else
        result = { id, 0, 0 }
      end
    else
      local ahead = waiting - #served
      if line then
        local rank
        if ahead == 0 then
          call('ZADD', LINE, '1', id)
          rank = 0
        else
          rank = call('ZRANK', LINE, id)
          if not rank then
            local last = call('ZRANGE', LINE, '-1', '-1', 'WITHSCORES')
            call('ZADD', LINE, int((#last > 0 and tonumber(last[2]) or 0) + 1), id)
            rank = ahead
          end
        end
        call('HSET', PLACES, id, int(now + PLACE_MS) .. ' ' .. kind .. ' ' .. ARGV[2] .. ' '
          .. int(lease_ms) .. ' 0')
        call('PEXPIRE', LINE, PLACE_MS_TEXT)
        call('PEXPIRE', PLACES, PLACE_MS_TEXT)
        call('DEL', WAKE .. ':' .. id) -- as in F.take_place
        ahead = rank
      end
      result = { false, retry, ahead }
    end
  end
  -- <name>, <name>:owner expire at the latest deadline, as in F.settle_expiry. <name> was
  -- written here: made again after it was emptied (no expiry yet) or changed, so that setting
  -- an expiry equal to its own fires nothing the call did not; the same for a changed owner set.
  if deadlines ~= 'none' then
    local current, latest
    if created then
      current = -1
    elseif deadlines == 'raised' then
      current = call('PEXPIRETIME', NAME)
    end
    if deadlines == 'raised' and current >= 0 then
      latest = math.max(current, latest_grant)
    elseif deadlines == 'raised' and created then
      latest = latest_grant
    elseif alive then
      -- Every expired holder went (the call pruned): the rest are the live ones.
      for _, at in pairs(alive) do
        if not latest or at > latest then
          latest = at
        end
      end
    else
      local top = call('ZRANGE', NAME, '-1', '-1', 'WITHSCORES')
      latest = #top > 0 and math.ceil(tonumber(top[2])) or nil
    end
    if latest and latest == latest and latest ~= math.huge and latest ~= -math.huge then
      local latest_text = int(latest)
      if current ~= latest then
        call('PEXPIREAT', NAME, latest_text)
      end
      if owner_written or call('PEXPIRETIME', OWNER) ~= latest then
        call('PEXPIREAT', OWNER, latest_text)
      end
    end
  end
  if op == 'TICK' then
    return retry
  end
  return result
end

-- The module's error texts (src/error.rs).
local ERR = {
  syntax = 'ERR syntax error',
  limit = 'ERR limit must be an integer from 1 to 4294967295',
  stored_limit = 'ERR limit must be an integer from 0 (pause) to 4294967295, or CLEAR',
  stored_limit_corrupt =
    "ERR the semaphore's limit key does not hold an integer from 0 to 4294967295",
  lease = 'ERR lease must be a number of seconds greater than 0 and at most 31536000, '
    .. 'with at most 3 decimals',
  count = 'ERR COUNT must be an integer from 1 to the limit (at most 4294967295)',
  release_count = 'ERR COUNT must be an integer from 1 to 4294967295',
  permits_corrupt =
    "ERR the semaphore's permits key holds a value that is not a count of permits",
  empty_name = 'ERR semaphore name must not be empty',
  empty_id = 'ERR identifier must not be empty',
  wrong_type = 'WRONGTYPE Operation against a key holding the wrong kind of value',
  counter = "ERR the semaphore's counter key does not hold an integer from 0 to "
    .. '9007199254740992 (2^53)',
  exhausted = "ERR the semaphore's counter reached 2^53: no ticket is left that a sorted-set "
    .. 'score holds exactly',
  ticket = "ERR the holder has no valid ticket in the semaphore's owner set "
    .. '(a whole number from 1 to 2^53)',
  fair_held = 'ERR the semaphore has live fair holders: use SEM.ACQUIREFAIR until they are gone',
  plain_held = 'ERR the semaphore has live plain holders: use SEM.ACQUIRE until they are gone',
}

-- The script's routines, in one table made at its full size. Lua makes a closure of every
-- routine at each call; with this table as their one upvalue, each costs a fraction of what
-- a local routine that names a dozen others does.
local F = {
  arity = false,
  count_mismatch = false,
  count_too_large = false,
  module_required = false,
  fail = false,
  int = false,
  decimal = false,
  parse_limit = false,
  parse_stored_limit = false,
  seconds_ms = false,
  parse_lease_ms = false,
  redis_integer = false,
  parse_weight = false,
  parse_extra = false,
  identifier = false,
  exists = false,
  now_ms = false,
  deadline_of = false,
  open = false,
  deadline = false,
  owner_score = false,
  ticket_from_score = false,
  counter = false,
  stored_limit = false,
  has_weights = false,
  weight = false,
  extra_field = false,
  batched = false,
  added_deadline = false,
  put_holder = false,
  put_owner = false,
  set_counter = false,
  remove = false,
  put_weights = false,
  settle_expiry = false,
  survey = false,
  prune = false,
  next_ticket = false,
  renew_holder = false,
  acquire_rule = false,
  wake_key = false,
  tell = false,
  drop = false,
  place_text = false,
  parse_place = false,
  take_place = false,
  retry_after = false,
  kind_error = false,
  serve_line = false,
  module_loaded = false,
  give_up_line = false,
  module_call = false,
  acquire = false,
  served = false,
  refresh = false,
  release = false,
  get = false,
  limit_op = false,
  tick = false,
  leave = false,
  main = false,
}

function F.arity(command)
  return "ERR wrong number of arguments for '" .. command .. "' command"
end

function F.count_mismatch(held)
  return 'ERR the holder holds ' .. held .. ' permits: renew with that COUNT, or none'
end

function F.count_too_large(held)
  return 'ERR COUNT is more than the ' .. held .. ' permits the holder holds'
end

function F.module_required(what)
  return 'ERR ' .. what .. ' needs the redsem module loaded in the server'
end

-- Errors raised by this script (caught in the entry point, at the end of the file).
function F.fail(message)
  error({ redsem_error = message })
end

-- An integer as Redis reads it: Lua's tostring writes large numbers as 1.7e+15.
F.int = int

------------------------------------------------------------------------------------------------
-- Parsing (src/args.rs)

-- Decimal digits only (leading zeros allowed); the value saturates at math.huge.
function F.decimal(s)
  if not s:find('^%d+$') then
    return nil
  end
  local digits = (s:gsub('^0+', ''))
  if digits == '' then
    return 0
  end
  if #digits > 15 then
    return math.huge
  end
  return tonumber(digits)
end

function F.parse_limit(s)
  local v = F.decimal(s)
  if v and v >= 1 and v <= MAX_LIMIT then
    return v
  end
  F.fail(ERR.limit)
end

function F.parse_stored_limit(s)
  local v = F.decimal(s)
  if v and v <= MAX_LIMIT then
    return v
  end
  return nil
end

-- digits[.d[d[d]]] seconds, in milliseconds; nil if malformed.
function F.seconds_ms(s)
  local whole, fraction = s:match('^([^.]*)%.(.*)$')
  if not whole then
    whole = s
  end
  local seconds = F.decimal(whole)
  if not seconds then
    return nil
  end
  local ms = 0
  if fraction then
    if #fraction < 1 or #fraction > 3 then
      return nil
    end
    local f = F.decimal(fraction)
    if not f then
      return nil
    end
    ms = f * ({ 100, 10, 1 })[#fraction]
  end
  return seconds * 1000 + ms
end

function F.parse_lease_ms(s)
  local ms = F.seconds_ms(s)
  if ms and ms >= 1 and ms <= MAX_LEASE_MS then
    return ms
  end
  F.fail(ERR.lease)
end

-- An integer in Redis's own syntax (no sign, no leading zero) from min to max (max_text).
function F.redis_integer(s, min, max_text)
  if not s:find('^%d+$') or (#s > 1 and s:sub(1, 1) == '0') then
    return nil
  end
  if #s > #max_text or (#s == #max_text and s > max_text) then
    return nil
  end
  local v = tonumber(s)
  if v < min then
    return nil
  end
  return v
end

-- A holder's field of <name>:permits: 2 to 4294967295.
function F.parse_weight(s)
  return F.redis_integer(s, 2, '4294967295') or F.fail(ERR.permits_corrupt)
end

-- The "" field of <name>:permits: 0 to 4294967295.
function F.parse_extra(s)
  return F.redis_integer(s, 0, '4294967295') or F.fail(ERR.permits_corrupt)
end

function F.identifier(id)
  if id == '' then
    F.fail(ERR.empty_id)
  end
  return id
end

------------------------------------------------------------------------------------------------
-- The keys (src/store.rs)

function F.exists(key)
  return redis.call('EXISTS', key) == 1
end

-- A deadline in whole milliseconds, rounded up (a foreign score may have decimals).
function F.deadline_of(score)
  if not score then
    return nil
  end
  return math.ceil(tonumber(score))
end

-- The call's store: which keys it opened and how it moved the deadlines in <name>, so that the
-- expiry can be settled at the end as the module does. `deadlines` is 'none' (unchanged),
-- 'raised' (holders were only added, the latest at `added`) or 'unknown'.
local store = { created = false, deadlines = 'none', added = 0, now_us = 0 }

-- The server's clock in milliseconds (deadlines); the same reading in microseconds is kept for
-- the tickets (store.now_us).
function F.now_ms()
  local time = redis.call('TIME')
  store.now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Every call checks the types first: a key of another type is an error that changes nothing.
-- A count of each key is the cheapest check there is (a command that answers WRONGTYPE for a
-- key of another type, before anything is written), cheaper than TYPE's status reply.
-- The counts are kept: until the call first writes <name>, <name>:owner or <name>:permits
-- (store.clean), they stand for EXISTS and ZCARD of those keys; the line's, until it changes.
function F.open()
  local holders = redis.call('ZCARD', NAME)
  store.created = holders == 0
  store.clean = true
  store.counts = { name = holders, owner = redis.call('ZCARD', OWNER),
    permits = redis.call('HLEN', PERMITS) }
  store.line = redis.call('ZCARD', LINE)
  redis.call('HLEN', PLACES)
end

-- How many wait in line.
function F.line_count()
  if store.line == nil then
    store.line = redis.call('ZCARD', LINE)
  end
  return store.line
end

function F.deadline(id)
  return F.deadline_of(redis.call('ZSCORE', NAME, id))
end

function F.owner_score(id)
  local score = redis.call('ZSCORE', OWNER, id)
  return score and tonumber(score)
end

-- A ticket: a whole number from 1 to 2^53.
function F.ticket_from_score(score)
  if score and score >= 1 and score <= MAX_TICKET and score == math.floor(score) then
    return score
  end
  return nil
end

-- The last ticket handed out; nil when <name>:counter does not exist.
function F.counter()
  local value = redis.call('GET', COUNTER) -- WRONGTYPE for another type
  if not value then
    return nil
  end
  return F.redis_integer(value, 0, MAX_TICKET_TEXT) or F.fail(ERR.counter)
end

-- The limit an operator stored; nil when there is none.
function F.stored_limit()
  local value = redis.call('GET', LIMIT) -- WRONGTYPE for another type
  if not value then
    return nil
  end
  return F.parse_stored_limit(value) or F.fail(ERR.stored_limit_corrupt)
end

function F.has_weights()
  if store.clean then
    return store.counts.permits > 0
  end
  return F.exists(PERMITS)
end

-- The permits `id` holds: its field in <name>:permits, 1 without one.
function F.weight(id)
  if not F.has_weights() then
    return 1
  end
  local value = redis.call('HGET', PERMITS, id)
  if not value then
    return 1
  end
  return F.parse_weight(value)
end

function F.extra_field()
  if not F.has_weights() then
    return 0
  end
  local value = redis.call('HGET', PERMITS, '')
  if not value then
    return 0
  end
  return F.parse_extra(value)
end

-- Calls `command key member...` over `members` in batches (unpack has a limit).
function F.batched(command, key, members)
  local done = 0
  for first = 1, #members, 1000 do
    local last = math.min(first + 999, #members)
    done = done + redis.call(command, key, unpack(members, first, last))
  end
  return done
end

function F.added_deadline(at)
  if store.deadlines == 'none' then
    store.deadlines = 'raised'
    store.added = at
  elseif store.deadlines == 'raised' then
    store.added = math.max(store.added, at)
  end
end

-- Sets `id`'s deadline. put: 'upsert' (add or move), 'if_held' (move only), 'if_new' (add
-- only). Returns 'added', 'updated' or 'not_held' (nothing changed).
function F.put_holder(id, at, put)
  store.clean = false
  if put == 'if_held' then
    if not redis.call('ZSCORE', NAME, id) then
      return 'not_held'
    end
    redis.call('ZADD', NAME, 'XX', F.int(at), id)
    store.deadlines = 'unknown'
    return 'updated'
  end
  local added
  if put == 'if_new' then
    added = redis.call('ZADD', NAME, 'NX', F.int(at), id)
  else
    added = redis.call('ZADD', NAME, F.int(at), id)
  end
  if added == 1 then
    F.added_deadline(at)
    return 'added'
  end
  if put == 'if_new' then
    return 'not_held'
  end
  store.deadlines = 'unknown'
  return 'updated'
end

function F.put_owner(id, ticket)
  store.clean = false
  redis.call('ZADD', OWNER, F.int(ticket), id)
end

function F.set_counter(ticket)
  redis.call('SET', COUNTER, F.int(ticket))
end

-- Removes `ids` from <name> and <name>:owner; returns how many were in <name>.
function F.remove(ids)
  if #ids == 0 then
    return 0
  end
  store.clean = false
  local removed = F.batched('ZREM', NAME, ids)
  F.batched('ZREM', OWNER, ids)
  if removed > 0 then
    if F.exists(NAME) then
      store.deadlines = 'unknown'
    else
      -- The set went with its last holder: what is added from here is all it will hold.
      store.created = true
      store.deadlines = 'none'
    end
  end
  return removed
end

-- Writes <name>:permits: `set_id` holds `set_permits` (a holder of 1 has no field), the
-- `removed` holders' fields go, and the "" field is `extra` (none when 0).
function F.put_weights(set_id, set_permits, removed, extra)
  store.clean = false
  local sets, deletes = {}, {}
  for i, id in ipairs(removed) do
    deletes[i] = id
  end
  if set_id then
    if set_permits > 1 then
      table.insert(sets, set_id)
      table.insert(sets, F.int(set_permits))
    else
      table.insert(deletes, set_id)
    end
  end
  if extra > 0 then
    table.insert(sets, '')
    table.insert(sets, F.int(extra))
  else
    table.insert(deletes, '')
  end
  if #sets > 0 then
    redis.call('HSET', PERMITS, unpack(sets))
  end
  if #deletes > 0 and F.exists(PERMITS) then
    F.batched('HDEL', PERMITS, deletes)
  end
end

-- <name>, <name>:owner and <name>:permits expire at the latest deadline, when this call moved a
-- deadline. A call that only added holders keeps a later expiry, as the module does.
function F.settle_expiry()
  if store.deadlines == 'none' then
    return
  end
  local current = redis.call('PEXPIRETIME', NAME)
  local latest
  if store.deadlines == 'raised' and current >= 0 then
    latest = math.max(current, store.added)
  elseif store.deadlines == 'raised' and store.created then
    latest = store.added
  else
    local top = redis.call('ZRANGE', NAME, -1, -1, 'WITHSCORES')
    if #top == 0 then
      return
    end
    latest = F.deadline_of(top[2])
  end
  if latest ~= latest or latest == math.huge or latest == -math.huge then
    return -- a foreign score of +inf: a holder that never expires
  end
  for _, key in ipairs({ NAME, OWNER, PERMITS }) do
    local at = redis.call('PEXPIRETIME', key)
    if at ~= -2 and at ~= latest then
      redis.call('PEXPIREAT', key, F.int(latest))
    end
  end
end

------------------------------------------------------------------------------------------------
-- The rules (src/semaphore.rs)

-- The state of the semaphore at `now`, read without changing anything.
function F.survey(now)
  local s = { expired = redis.call('ZRANGEBYSCORE', NAME, '-inf', F.int(now)) }
  s.is_expired = {}
  for _, id in ipairs(s.expired) do
    s.is_expired[id] = true
  end
  local holders, owners
  if store.clean then
    holders, owners = store.counts.name, store.counts.owner
  else
    holders, owners = redis.call('ZCARD', NAME), redis.call('ZCARD', OWNER)
  end
  s.live = holders - #s.expired
  s.leftovers = 'none'
  if owners == 0 then
    s.kind = s.live > 0 and 'plain' or nil
  elseif s.live == 0 then
    s.leftovers = 'all'
  else
    local expired_owners = 0
    for _, id in ipairs(s.expired) do
      if F.owner_score(id) then
        expired_owners = expired_owners + 1
      end
    end
    if owners - expired_owners == s.live then
      s.kind = 'fair'
    else
      -- Another client wrote one of the keys: find the owner entries with no holder.
      local owned_live, orphans = 0, {}
      for _, id in ipairs(redis.call('ZRANGE', OWNER, 0, -1)) do
        local at = F.deadline(id)
        if not at then
          table.insert(orphans, id)
        elseif at > now then
          owned_live = owned_live + 1
        end
      end
      if owned_live == 0 then
        s.kind, s.leftovers = 'plain', 'all'
      elseif #orphans == 0 then
        s.kind = 'fair'
      else
        s.kind, s.leftovers = 'fair', orphans
      end
    end
  end
  -- Permits held beyond one per live holder, and the expired weighted holders' fields.
  s.extra, s.weights, s.expired_extra = 0, 'keep', 0
  if F.has_weights() then
    if s.live == 0 then
      s.weights = 'clear'
      -- Every holder expired: the "" field, read leniently, is all their extra permits.
      s.expired_extra = tonumber(redis.call('HGET', PERMITS, '') or '0') or 0
    else
      local extra = F.extra_field()
      local pruned = {}
      for _, id in ipairs(s.expired) do
        local permits = F.weight(id)
        if permits > 1 then
          extra = math.max(extra - (permits - 1), 0)
          s.expired_extra = s.expired_extra + permits - 1
          table.insert(pruned, id)
        end
      end
      s.extra = extra
      if #pruned > 0 then
        s.weights = pruned
      end
    end
  end
  -- Permits freed by removing the expired holders (their wake-up tokens).
  s.freed = #s.expired + s.expired_extra
  s.in_use = s.live + s.extra
  return s
end

-- The first change of every writing rule: expired holders and leftovers go.
function F.prune(s)
  F.remove(s.expired)
  if s.leftovers ~= 'none' or s.weights ~= 'keep' then
    store.clean = false
  end
  if s.leftovers == 'all' then
    redis.call('DEL', OWNER)
  elseif s.leftovers ~= 'none' then
    F.batched('ZREM', OWNER, s.leftovers)
  end
  if s.weights == 'clear' then
    redis.call('DEL', PERMITS)
  elseif s.weights ~= 'keep' then
    F.put_weights(nil, nil, s.weights, s.extra)
  end
end

-- What a refresh or release found: 1 for a live holder, else 0 (expired or absent).
local LIVE, LOST = 1, 0

-- The next fair ticket: above the counter, and at least the clock of F.now_ms in microseconds.
function F.next_ticket()
  local last = F.counter() or 0
  if last >= MAX_TICKET then
    F.fail(ERR.exhausted)
  end
  local ticket = math.max(last + 1, store.now_us)
  if ticket > MAX_TICKET then
    F.fail(ERR.exhausted)
  end
  return ticket
end

-- Renews live holder `id`: its deadline moves, its permits and ticket stay.
function F.renew_holder(s, id, kind, count, at)
  if count then
    local held = F.weight(id)
    if count ~= held then
      F.fail(F.count_mismatch(held))
    end
  end
  local ticket
  if kind == 'fair' then
    ticket = F.ticket_from_score(F.owner_score(id)) or F.fail(ERR.ticket)
  end
  F.prune(s)
  F.put_holder(id, at, 'if_held')
  return { ticket = ticket, renewed = true }
end

-- SEM.ACQUIRE / SEM.ACQUIREFAIR: returns the grant ({ticket, renewed}) or nil (full), and the
-- survey and limit it used.
function F.acquire_rule(now, id, kind, limit, lease_ms, count)
  local s = F.survey(now)
  if s.kind and s.kind ~= kind then
    F.fail(s.kind == 'fair' and ERR.fair_held or ERR.plain_held)
  end
  local permits = count or 1
  limit = F.stored_limit() or limit
  local room = s.in_use + permits <= limit
  local at = now + lease_ms
  -- One permit, and no COUNT to compare with a renewal.
  if not count then
    if kind == 'plain' then
      F.prune(s)
      -- A full semaphore still renews a holder that retries with its identifier.
      local outcome = F.put_holder(id, at, room and 'upsert' or 'if_held')
      if outcome == 'not_held' then
        return nil, s, limit
      end
      return { renewed = outcome == 'updated' }, s, limit
    elseif room then
      local ticket = F.next_ticket()
      local expired = s.is_expired[id]
      if expired or F.put_holder(id, at, 'if_new') == 'added' then
        F.prune(s)
        if expired then
          F.put_holder(id, at, 'upsert')
        end
        F.set_counter(ticket)
        F.put_owner(id, ticket)
        return { ticket = ticket, renewed = false }, s, limit
      end
      return F.renew_holder(s, id, kind, count, at), s, limit
    end
  end
  local held_until = F.deadline(id)
  if held_until and held_until > now then
    return F.renew_holder(s, id, kind, count, at), s, limit
  end
  if not room then
    F.prune(s)
    return nil, s, limit
  end
  local ticket
  if kind == 'fair' then
    ticket = F.next_ticket()
  end
  F.prune(s)
  F.put_holder(id, at, 'upsert')
  if ticket then
    F.set_counter(ticket)
    F.put_owner(id, ticket)
  end
  if permits > 1 then
    F.put_weights(id, permits, {}, s.extra + permits - 1)
  end
  return { ticket = ticket, renewed = false }, s, limit
end

------------------------------------------------------------------------------------------------
-- The line (this script's own: the module keeps its line in memory)

function F.wake_key(id)
  return WAKE .. ':' .. id
end

-- Tells waiter `id` `message` on its list; a list another client made another type is skipped
-- (the waiter finds its grant at its next attempt, which renews it).
function F.tell(id, message)
  local key = F.wake_key(id)
  if type(redis.pcall('RPUSH', key, message)) == 'number' then
    redis.call('PEXPIRE', key, PLACE_MS)
  end
end

function F.drop(id)
  store.line = nil
  redis.call('ZREM', LINE, id)
  redis.call('HDEL', PLACES, id)
end

function F.place_text(deadline_at, kind, limit, lease_ms, count)
  return F.int(deadline_at) .. ' ' .. kind .. ' ' .. F.int(limit) .. ' ' .. F.int(lease_ms) .. ' '
    .. F.int(count or 0)
end

-- A place as the script wrote it; nil for anything else (another client wrote it: dropped).
function F.parse_place(text)
  if not text then
    return nil
  end
  local at, kind, limit, lease_ms, count = text:match('^(%d+) (%a+) (%d+) (%d+) (%d+)$')
  if not at or (kind ~= 'plain' and kind ~= 'fair') then
    return nil
  end
  limit, lease_ms, count = tonumber(limit), tonumber(lease_ms), tonumber(count)
  if limit < 1 or limit > MAX_LIMIT or lease_ms < 1 or lease_ms > MAX_LEASE_MS
    or count > limit then
    return nil
  end
  return { deadline = tonumber(at), kind = kind, limit = limit, lease_ms = lease_ms,
    count = count > 0 and count or nil }
end

-- Takes (or keeps) `id`'s place at the end of the line, held until now + PLACE_MS, and empties
-- its list; returns how many wait before it.
function F.take_place(now, id, kind, limit, lease_ms, count)
  local rank
  if F.line_count() == 0 then
    redis.call('ZADD', LINE, 1, id)
    rank = 0
  else
    rank = redis.call('ZRANK', LINE, id)
    if not rank then
      local last = redis.call('ZRANGE', LINE, -1, -1, 'WITHSCORES')
      local number = (#last > 0 and tonumber(last[2]) or 0) + 1
      redis.call('ZADD', LINE, F.int(number), id)
      rank = store.line
    end
  end
  store.line = nil
  redis.call('HSET', PLACES, id, F.place_text(now + PLACE_MS, kind, limit, lease_ms, count))
  redis.call('PEXPIRE', LINE, PLACE_MS)
  redis.call('PEXPIRE', PLACES, PLACE_MS)
  -- What the waiter was told before this attempt is past: a grant whose lease ran out before
  -- the waiter came back (it was away through a failover, or stalled) left it not holding, and
  -- it would take that "G" from its list for a permit, counting a lease from this attempt.
  redis.call('DEL', F.wake_key(id))
  return rank
end

-- Milliseconds until the earliest live holder's deadline; 0 when none is live.
function F.retry_after(now)
  local first = redis.call('ZRANGEBYSCORE', NAME, '(' .. F.int(now), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  if #first == 0 then
    return 0
  end
  return math.max(F.deadline_of(first[2]) - now, 0)
end

function F.kind_error(message)
  return message == ERR.fair_held or message == ERR.plain_held
end

-- Serves the line at `now`: grants its first waiters, in order, while they fit. A grant to
-- `caller` is returned rather than told. A new first waiter that a lease end may serve before
-- its next attempt is told "H<ms>", so that it watches that deadline.
function F.serve_line(now, caller)
  if F.line_count() == 0 then
    return nil
  end
  local mine, moved, head, stays = nil, false, nil, false
  for _ = 1, SERVE_MAX do
    head = redis.call('ZRANGE', LINE, 0, 0)[1]
    if not head then
      break
    end
    local place = F.parse_place(redis.call('HGET', PLACES, head))
    if not place or place.deadline <= now then
      F.drop(head)
      moved = true
    else
      local ok, grant = pcall(F.acquire_rule, now, head, place.kind, place.limit, place.lease_ms,
        place.count)
      if not ok then
        local message = type(grant) == 'table' and (grant.redsem_error or grant.err)
        if F.kind_error(message) then
          stays = true
          break -- holders of the other kind: the head waits until they are gone
        end
        F.drop(head)
        moved = true
        F.tell(head, 'E' .. tostring(message or grant))
      elseif not grant then
        stays = true
        break
      else
        F.drop(head)
        moved = true
        if head == caller then
          mine = grant
        else
          F.tell(head, 'G' .. (grant.ticket and F.int(grant.ticket) or ''))
        end
      end
    end
  end
  if moved then
    -- The loop ends at the first waiter that stays, or an empty line (after SERVE_MAX: look).
    if head and not stays then
      head = redis.call('ZRANGE', LINE, 0, 0)[1]
    end
    if head and head ~= caller then
      local wait = F.retry_after(now)
      if wait > 0 and wait < NUDGE_MS then
        F.tell(head, 'H' .. F.int(wait))
      end
    end
  end
  return mine
end

-- The module is loaded: every waiter in line is told "M" and the line goes.
function F.module_loaded()
  return redis.call('COMMAND', 'INFO', 'SEM.ACQUIRE')[1] and true or false
end

function F.give_up_line()
  if redis.call('TYPE', LINE).ok ~= 'zset' then
    return
  end
  for _, id in ipairs(redis.call('ZRANGE', LINE, 0, FLUSH_MAX - 1)) do
    F.tell(id, 'M')
  end
  store.line = nil
  redis.call('DEL', LINE, PLACES)
end

-- The module's command for this call, in the long form (every key named).
function F.module_call(command, args)
  F.give_up_line()
  return redis.call(command, NAME, OWNER, COUNTER, PERMITS, LIMIT, unpack(args))
end

------------------------------------------------------------------------------------------------
-- The operations (src/commands.rs)

function F.acquire(kind, args)
  local command = kind == 'fair' and 'sem.acquirefair' or 'sem.acquire'
  if #args < 2 then
    F.fail(F.arity(command))
  end
  local limit = F.parse_limit(args[1])
  local lease_ms = F.parse_lease_ms(args[2])
  local id, with_ticket, count, line
  local module_args = { args[1], args[2] }
  local i = 3
  while i <= #args do
    local option = string.upper(args[i])
    local value = args[i + 1]
    if option == 'ID' and not id then
      id = F.identifier(value or F.fail(ERR.syntax))
      i = i + 2
    elseif option == 'WITHTICKET' and kind == 'fair' and not with_ticket then
      with_ticket = true
      i = i + 1
    elseif option == 'COUNT' and not count then
      local n = F.decimal(value or F.fail(ERR.syntax))
      if not n or n < 1 or n > limit then
        F.fail(ERR.count)
      end
      count = n
      i = i + 2
    elseif option == 'LINE' and not line then
      line = true
      i = i + 1
    elseif option == 'WAIT' then
      F.fail(F.module_required('WAIT') .. ': without it the client packages wait themselves')
    elseif option == 'BOUND' then
      F.fail(F.module_required('BOUND'))
    else
      F.fail(ERR.syntax)
    end
    if option ~= 'LINE' then
      table.insert(module_args, args[i - (option == 'WITHTICKET' and 1 or 2)])
      if option ~= 'WITHTICKET' then
        table.insert(module_args, value)
      end
    end
  end
  if not id then
    F.fail('ERR ID <identifier> is required: only the redsem module makes identifiers')
  end
  if F.module_loaded() then
    if redis.call('TYPE', LINE).ok == 'zset' then
      F.drop(id)
    end
    redis.call('DEL', F.wake_key(id))
    return { F.module_call(string.upper(command), module_args), 0, -1 }
  end
  F.open()
  local now = F.now_ms()
  local reply = function(grant)
    if with_ticket and grant.ticket then
      return { { id, grant.ticket }, 0, 0 }
    end
    return { id, 0, 0 }
  end
  -- The line first: the caller may be its head, and then it is granted here.
  local grant = F.serve_line(now, id)
  local queued = F.line_count() > 0
  local held_until = F.deadline(id)
  if not grant and ((held_until and held_until > now) or not queued
    or (kind == 'plain' and not line)) then
    grant = F.acquire_rule(now, id, kind, limit, lease_ms, count)
  end
  if grant then
    if queued then
      F.drop(id)
    end
    if queued or line then
      -- A grant told on the list before this attempt renewed it must not outlive it: a later
      -- wait with the same identifier would take it for its own.
      redis.call('DEL', F.wake_key(id))
    end
    F.settle_expiry()
    return reply(grant)
  end
  local ahead
  if line then
    ahead = F.take_place(now, id, kind, limit, lease_ms, count)
  else
    ahead = redis.call('ZCARD', LINE)
  end
  F.settle_expiry()
  return { false, F.retry_after(now), ahead }
end

-- The end of every call that may have freed permits: the line is served, the expiry settled.
function F.served(now, result)
  F.serve_line(now, nil)
  F.settle_expiry()
  return result
end

function F.refresh(args)
  if #args ~= 2 then
    F.fail(F.arity('sem.refresh'))
  end
  local id = F.identifier(args[1])
  local lease_ms = F.parse_lease_ms(args[2])
  if F.module_loaded() then
    return F.module_call('SEM.REFRESH', args)
  end
  F.open()
  local now = F.now_ms()
  local s = F.survey(now)
  F.prune(s)
  local result = LIVE
  if F.put_holder(id, now + lease_ms, 'if_held') ~= 'updated' then
    F.remove({ id })
    result = LOST
  end
  return F.served(now, result)
end

function F.release(args)
  if #args < 1 then
    F.fail(F.arity('sem.release'))
  end
  local count
  local i = 2
  while i <= #args do
    if string.upper(args[i]) == 'COUNT' and not count then
      local value = args[i + 1] or F.fail(ERR.syntax)
      local n = F.decimal(value)
      if not n or n < 1 or n > MAX_LIMIT then
        F.fail(ERR.release_count)
      end
      count = n
      i = i + 2
    else
      F.fail(ERR.syntax)
    end
  end
  local id = F.identifier(args[1])
  if F.module_loaded() then
    return F.module_call('SEM.RELEASE', args)
  end
  F.open()
  local now = F.now_ms()
  local s = F.survey(now)
  local result = LOST
  local held_until = F.deadline(id)
  if not count and not F.has_weights() then
    -- An expired `id` goes with the others, so what is left of it here was live.
    F.prune(s)
    if F.remove({ id }) == 1 then
      result = LIVE
    end
  elseif not held_until or held_until <= now then
    F.prune(s)
    F.remove({ id })
  else
    local held = F.weight(id)
    local giving = count or held
    if giving > held then
      F.fail(F.count_too_large(held))
    end
    F.prune(s)
    local extra = math.max(s.extra - math.min(giving, held - 1), 0)
    if giving == held then
      F.remove({ id })
      if held > 1 then
        F.put_weights(nil, nil, { id }, extra)
      end
    else
      F.put_weights(id, held - giving, {}, extra)
    end
    result = LIVE
  end
  return F.served(now, result)
end

function F.get(args)
  if #args == 1 and string.upper(args[1]) == 'JSON' then
    F.fail(F.module_required('SEM.GET JSON'))
  elseif #args > 0 then
    F.fail(ERR.syntax)
  end
  if F.module_loaded() then
    return F.module_call('SEM.GET', args)
  end
  F.open()
  return F.survey(F.now_ms()).in_use
end

function F.limit_op(args)
  local change -- nil: read; false: clear; a number: store it
  if #args == 1 and string.upper(args[1]) == 'CLEAR' then
    change = false
  elseif #args == 1 then
    change = F.parse_stored_limit(args[1])
    if not change then
      F.fail(ERR.stored_limit)
    end
  elseif #args > 1 then
    F.fail(F.arity('sem.limit'))
  end
  if F.module_loaded() then
    return F.module_call('SEM.LIMIT', args)
  end
  F.open()
  local current = F.stored_limit()
  if change == nil then
    return current or false
  end
  local now = F.now_ms()
  if change == false then
    if current then
      redis.call('DEL', LIMIT)
    end
    return F.served(now, current and 1 or 0)
  end
  if current ~= change then
    redis.call('SET', LIMIT, F.int(change))
  end
  return F.served(now, redis.status_reply('OK'))
end

function F.tick(args)
  if #args > 0 then
    F.fail(ERR.syntax)
  end
  if F.module_loaded() then
    F.give_up_line()
    return 0
  end
  F.open()
  local now = F.now_ms()
  F.serve_line(now, nil)
  F.settle_expiry()
  return F.retry_after(now)
end

function F.leave(args)
  if #args ~= 1 then
    F.fail(ERR.syntax)
  end
  local id = F.identifier(args[1])
  F.open()
  local now = F.now_ms()
  local key = F.wake_key(id)
  local got = false
  if redis.call('TYPE', key).ok == 'list' then
    for _, message in ipairs(redis.call('LRANGE', key, 0, -1)) do
      local first = message:sub(1, 1)
      if not got and (first == 'G' or first == 'E') then
        got = message
      end
    end
    redis.call('DEL', key)
  end
  -- A grant is handed over only to a live holder: one whose lease ran out (or that another
  -- client removed) holds nothing, and its caller must not count a lease from it.
  if got and got:sub(1, 1) == 'G' then
    local held_until = F.deadline(id)
    if not held_until or held_until <= now then
      got = false
    end
  end
  if F.line_count() == 0 then
    return got
  end
  F.drop(id)
  if F.module_loaded() then
    F.give_up_line()
    return got
  end
  return F.served(now, got)
end

local OPERATIONS = {
  ACQUIRE = function(args) return F.acquire('plain', args) end,
  ACQUIREFAIR = function(args) return F.acquire('fair', args) end,
  REFRESH = F.refresh,
  RELEASE = F.release,
  GET = F.get,
  LIMIT = F.limit_op,
  TICK = F.tick,
  LEAVE = F.leave,
}

function F.main()
  if NAME == '' then
    F.fail(ERR.empty_name)
  end
  local derived = { OWNER = ':owner', COUNTER = ':counter', PERMITS = ':permits',
    LIMIT = ':limit', WAKE = ':wake' }
  if #KEYS ~= 6 or OWNER ~= NAME .. derived.OWNER or COUNTER ~= NAME .. derived.COUNTER
    or PERMITS ~= NAME .. derived.PERMITS or LIMIT ~= NAME .. derived.LIMIT
    or WAKE ~= NAME .. derived.WAKE then
    F.fail('ERR the redsem script takes 6 keys: <name> <name>:owner <name>:counter '
      .. '<name>:permits <name>:limit <name>:wake')
  end
  local operation = ARGV[1] and OPERATIONS[string.upper(ARGV[1])]
  if not operation then
    F.fail('ERR unknown redsem script operation: use ACQUIRE, ACQUIREFAIR, REFRESH, RELEASE, '
      .. 'GET, LIMIT, TICK or LEAVE')
  end
  local args = {}
  for i = 2, #ARGV do
    args[i - 1] = ARGV[i]
  end
  return operation(args)
end

local ok, result = pcall(F.main)
if ok then
  return result
end
if type(result) == 'table' and result.redsem_error then
  return redis.error_reply(result.redsem_error)
end
if type(result) == 'table' and result.err then
  return result -- a command's error, as the server sent it
end
if type(result) == 'string' and result:find('^%u+ ') then
  return redis.error_reply(result) -- the same, as Redis 7.0 raises it
end
error(result)
