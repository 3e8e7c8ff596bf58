//! The task queue's Lua scripts, one per transition: each runs atomically in Redis, so a
//! master can die between any two and the next one resumes from what Redis holds. Their
//! keys and arguments are named in the comment at the top of each.

pub(super) const ENQUEUE: &str = r#"
-- KEYS: task order pending cursor planned bytes totals
-- ARGV: stream next_cursor then (id order proto bytes)* then planned_all
local added = 0
for i = 3, #ARGV - 3, 4 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 2]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    redis.call('ZADD', KEYS[3], ARGV[i + 1], ARGV[i])
    redis.call('HSET', KEYS[6], ARGV[i], ARGV[i + 3])
    redis.call('HINCRBY', KEYS[7], 'bytes', ARGV[i + 3])
    added = added + 1
  end
end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
if ARGV[#ARGV] == '1' then redis.call('HSET', KEYS[5], ARGV[1], '1') end
return added
"#;

pub(super) const ACQUIRE: &str = r#"
-- KEYS: pending running task offset attempts executors order stream stream_task position
-- acquired_request acquired_task
-- ARGV: executor now_ms max_lead_windows window_divisor request
redis.call('HSET', KEYS[6], ARGV[1], ARGV[2])
local function binding(source)
  local id = source .. '/stream'
  return {'stream', redis.call('HGET', KEYS[9], source),
          redis.call('HGET', KEYS[4], id) or '0', '1', redis.call('HGET', KEYS[10], id) or ''}
end
local function given(id)
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[11], ARGV[1], ARGV[5])
    redis.call('HSET', KEYS[12], ARGV[1], id)
  end
end
-- A retried request, whose answer was lost, is given what it was given if it still holds it.
if ARGV[5] ~= '' and redis.call('HGET', KEYS[11], ARGV[1]) == ARGV[5] then
  local id = redis.call('HGET', KEYS[12], ARGV[1]) or ''
  local source = string.match(id, '^(.*)/stream$')
  if source and redis.call('HGET', KEYS[8], source) == ARGV[1] then return binding(source) end
  if not source and redis.call('HGET', KEYS[2], id) == ARGV[1] then
    return {'batch', redis.call('HGET', KEYS[3], id), redis.call('HGET', KEYS[4], id) or '0',
            redis.call('HGET', KEYS[5], id) or '1'}
  end
end
local bindings = redis.call('HGETALL', KEYS[8])
for i = 1, #bindings, 2 do
  if bindings[i + 1] == '' then
    redis.call('HSET', KEYS[8], bindings[i], ARGV[1])
    given(bindings[i] .. '/stream')
    return binding(bindings[i])
  end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head == 0 then return {'empty'} end
local id = head[1]
local lead = tonumber(ARGV[3])
if lead > 0 then
  local divisor = tonumber(ARGV[4])
  local head_window = math.floor(tonumber(head[2]) / divisor)
  local oldest = head_window
  local running = redis.call('HKEYS', KEYS[2])
  for i = 1, #running do
    local w = math.floor(tonumber(redis.call('HGET', KEYS[7], running[i])) / divisor)
    if w < oldest then oldest = w end
  end
  if head_window - oldest >= lead then return {'throttled'} end
end
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', KEYS[2], id, ARGV[1])
given(id)
local attempt = redis.call('HINCRBY', KEYS[5], id, 1)
local offset = redis.call('HGET', KEYS[4], id) or '0'
return {'batch', redis.call('HGET', KEYS[3], id), offset, tostring(attempt)}
"#;

pub(super) const PROGRESS: &str = r#"
-- KEYS: running offset executors stream position read
-- ARGV: id executor offset now_ms sequence rows (both '': no stream position) heartbeat
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  local source = string.match(ARGV[1], '^(.*)/stream$')
  if not source or redis.call('HGET', KEYS[4], source) ~= ARGV[2] then return 0 end
end
if ARGV[7] == '1' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[4]) end
local current = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[3]) > current then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  -- Task ids start with their source's name.
  redis.call('HINCRBY', KEYS[6], string.match(ARGV[1], '^[^/]*'), tonumber(ARGV[3]) - current)
end
if ARGV[5] ~= '' then
  local sequence, rows = tonumber(ARGV[5]), tonumber(ARGV[6])
  local known = redis.call('HGET', KEYS[5], ARGV[1])
  local newer = true
  if known then
    local s, r = string.match(known, '^(%d+) (%d+)$')
    s, r = tonumber(s), tonumber(r)
    newer = sequence > s or (sequence == s and rows > r)
  end
  if newer then redis.call('HSET', KEYS[5], ARGV[1], ARGV[5] .. ' ' .. ARGV[6]) end
end
return 1
"#;

pub(super) const FINISH: &str = r#"
-- KEYS: running succeeded failed pending order attempts offset executors stream bytes rows
-- totals; ARGV: id executor error max_attempts now_ms
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  -- A stream binding ends only by failing (a stream has no end): it fails the job.
  local source = string.match(ARGV[1], '^(.*)/stream$')
  if not source or redis.call('HGET', KEYS[9], source) ~= ARGV[2] then return 'not_owner' end
  redis.call('HSET', KEYS[8], ARGV[2], ARGV[5])
  if ARGV[3] == '' then
    redis.call('HSET', KEYS[9], source, '')
    return 'requeued'
  end
  redis.call('HDEL', KEYS[9], source)
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  return 'failed'
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[8], ARGV[2], ARGV[5])
if ARGV[3] == '' then
  -- The last offset reported covers every row: executors report it before finishing.
  local rows = redis.call('HGET', KEYS[7], ARGV[1]) or '0'
  if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
    redis.call('HSET', KEYS[11], ARGV[1], rows)
    redis.call('HINCRBY', KEYS[12], 'rows_done', rows)
    redis.call('HINCRBY', KEYS[12], 'bytes_done', redis.call('HGET', KEYS[10], ARGV[1]) or '0')
  end
  redis.call('HDEL', KEYS[7], ARGV[1])
  return 'succeeded'
end
if tonumber(redis.call('HGET', KEYS[6], ARGV[1]) or '0') >= tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  return 'failed'
end
redis.call('ZADD', KEYS[4], redis.call('HGET', KEYS[5], ARGV[1]), ARGV[1])
return 'requeued'
"#;

pub(super) const REQUEUE_EXECUTOR: &str = r#"
-- KEYS: running executors pending order attempts failed stream
-- ARGV: executor max_attempts reason refund ('1': the attempt does not count) silent_before
-- (when set, an executor that heartbeated at or after it keeps its work: -1)
if ARGV[5] ~= '' then
  local seen = redis.call('HGET', KEYS[2], ARGV[1])
  if seen and tonumber(seen) >= tonumber(ARGV[5]) then return -1 end
end
local requeued = 0
local running = redis.call('HGETALL', KEYS[1])
for i = 1, #running, 2 do
  local id = running[i]
  if running[i + 1] == ARGV[1] then
    redis.call('HDEL', KEYS[1], id)
    if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[5], id, -1) end
    if tonumber(redis.call('HGET', KEYS[5], id) or '0') >= tonumber(ARGV[2]) then
      redis.call('HSET', KEYS[6], id, ARGV[3])
    else
      redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[4], id), id)
      requeued = requeued + 1
    end
  end
end
local bindings = redis.call('HGETALL', KEYS[7])
for i = 1, #bindings, 2 do
  if bindings[i + 1] == ARGV[1] then redis.call('HSET', KEYS[7], bindings[i], '') end
end
redis.call('HDEL', KEYS[2], ARGV[1])
return requeued
"#;

pub(super) const YIELD_TASK: &str = r#"
-- KEYS: running offset attempts pending order read; ARGV: id executor served_offset
-- A task taken back from a straggler goes back to pending at the rows it served; the
-- attempt does not count.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[3]) > current then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  -- Task ids start with their source's name.
  redis.call('HINCRBY', KEYS[6], string.match(ARGV[1], '^[^/]*'), tonumber(ARGV[3]) - current)
end
redis.call('HINCRBY', KEYS[3], ARGV[1], -1)
redis.call('ZADD', KEYS[4], redis.call('HGET', KEYS[5], ARGV[1]), ARGV[1])
return 1
"#;

pub(super) const TOUCH_KNOWN: &str = r#"
-- KEYS: executors; ARGV: executor now_ms
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 0
"#;

pub(super) const COUNTS: &str = r#"
-- KEYS: task pending running succeeded failed totals
local totals = redis.call('HMGET', KEYS[6], 'bytes', 'bytes_done', 'rows_done')
return {redis.call('HLEN', KEYS[1]), redis.call('ZCARD', KEYS[2]), redis.call('HLEN', KEYS[3]),
        redis.call('SCARD', KEYS[4]), redis.call('HLEN', KEYS[5]),
        tonumber(totals[1] or '0'), tonumber(totals[2] or '0'), tonumber(totals[3] or '0')}
"#;

pub(super) const STAGE_CHECKPOINT: &str = r#"
-- KEYS: offset position succeeded checkpoint; ARGV: prefix id
-- Copies the queue's offsets, stream positions and succeeded set as they are at a
-- checkpoint's barrier, for COMMIT_CHECKPOINT once its snapshots are written.
local function stage(from, name)
  local to = ARGV[1] .. 'checkpoint:staged:' .. name
  redis.call('DEL', to)
  if redis.call('EXISTS', from) == 1 then redis.call('COPY', from, to) end
end
stage(KEYS[1], 'offset')
stage(KEYS[2], 'position')
stage(KEYS[3], 'succeeded')
redis.call('HSET', KEYS[4], 'staged', ARGV[2])
return 1
"#;

pub(super) const COMMIT_CHECKPOINT: &str = r#"
-- KEYS: checkpoint; ARGV: prefix id record
-- Makes the staged queue state checkpoint `id`'s, the record the latest checkpoint, and
-- drops the previous one's copies: one atomic commit. 0 when `id` is not what is staged.
if redis.call('HGET', KEYS[1], 'staged') ~= ARGV[2] then return 0 end
local function saved(id, name) return ARGV[1] .. 'checkpoint:' .. id .. ':' .. name end
local previous = redis.call('HGET', KEYS[1], 'latest')
for _, name in ipairs({'offset', 'position', 'succeeded'}) do
  local staged = ARGV[1] .. 'checkpoint:staged:' .. name
  redis.call('DEL', saved(ARGV[2], name))
  if redis.call('EXISTS', staged) == 1 then redis.call('RENAME', staged, saved(ARGV[2], name)) end
end
redis.call('HDEL', KEYS[1], 'staged')
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'latest', ARGV[2])
if previous and previous ~= ARGV[2] then
  redis.call('HDEL', KEYS[1], previous)
  redis.call('DEL', saved(previous, 'offset'), saved(previous, 'position'),
             saved(previous, 'succeeded'))
end
return 1
"#;

pub(super) const ROLLBACK: &str = r#"
-- KEYS: offset succeeded pending order running position bytes rows totals
-- ARGV: prefix id ('0': none)
-- Back to the checkpoint: its offsets and stream positions, and every task that succeeded
-- after it pending again. Runs when no executor holds a task (after the previous ones'
-- work was taken back).
if redis.call('HLEN', KEYS[5]) > 0 then return -1 end
local saved_offset = ARGV[1] .. 'checkpoint:' .. ARGV[2] .. ':offset'
local saved_position = ARGV[1] .. 'checkpoint:' .. ARGV[2] .. ':position'
local saved_succeeded = ARGV[1] .. 'checkpoint:' .. ARGV[2] .. ':succeeded'
redis.call('DEL', KEYS[1], KEYS[6])
if redis.call('EXISTS', saved_offset) == 1 then redis.call('COPY', saved_offset, KEYS[1]) end
if redis.call('EXISTS', saved_position) == 1 then redis.call('COPY', saved_position, KEYS[6]) end
local reopened = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('SISMEMBER', saved_succeeded, id) == 0 then
    redis.call('SREM', KEYS[2], id)
    redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[4], id), id)
    -- 0 - n: Redis refuses the '-0' that -n gives for 0.
    redis.call('HINCRBY', KEYS[9], 'rows_done', 0 - tonumber(redis.call('HGET', KEYS[8], id) or '0'))
    redis.call('HINCRBY', KEYS[9], 'bytes_done', 0 - tonumber(redis.call('HGET', KEYS[7], id) or '0'))
    redis.call('HDEL', KEYS[8], id)
    reopened = reopened + 1
  end
end
return reopened
"#;
