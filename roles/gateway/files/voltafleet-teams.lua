-- Managed by voltafleet (roles/gateway): usage per team at the gateway, for Prometheus.
-- vf_usage, a filter on the frontend, reads every answer's body as it passes, chunk by chunk,
-- for llama-server's own token figures; vf_account runs once a request, when HAProxy logs it
-- (the frontend's log-format calls it), so a stream is counted with its whole duration and
-- whatever it had sent when it ended; vf_team_metrics serves the counters and the stick
-- table's live figures at /metrics/teams. One Lua state (lua-load): the counters are exact
-- across threads; a reload starts them at zero (a counter reset to Prometheus). The token
-- budgets' counts (vf_budget) are kept in files instead: they survive a reload and a restart.
local usage = {}
local TABLE = "vf_teams"

-- Fail closed (issue 48): the gateway's own errors by stage (voltafleet/front/routes.py ERROR_STAGES), for
-- voltafleet_gateway_errors_total. A stage that fails sets txn.vf_error; the frontend answers 503 for it.
local errors = {limits = 0, budget = 0, budget_files = 0, budget_loading = 0, rewrite = 0, count = 0, record = 0, account = 0}
local said = {}  -- the last time (epoch s) each stage's error was written to HAProxy's log: once a minute

local function alert(stage, err)
  local now = os.time()
  if (said[stage] or 0) + 60 <= now then
    said[stage] = now
    core.Alert("voltafleet gateway: " .. stage .. " failed: " .. tostring(err))
  end
end

local function fail(txn, stage, err)
  txn:set_var("txn.vf_error", stage)
  alert(stage, err)
end

-- An action run under pcall: an error in it marks the request failed at its stage (the frontend's 503)
-- instead of letting HAProxy go on as if the action had passed.
local function guard(stage, fn)
  return function(txn, ...)
    local ok, err = pcall(fn, txn, ...)
    if not ok then fail(txn, stage, err) end
  end
end

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec // 1000
end

-- llama-server's figures, each a JSON key followed by a whole number. The key with its closing
-- quote and colon never occurs inside a JSON string (a quote there is escaped), so a model's
-- text cannot forge one; "prompt_tokens": does not match "prompt_tokens_details". A figure is
-- taken once its number is followed by another character (never cut by a chunk's end).
local KEYS = {"prompt_tokens", "completion_tokens", "reasoning_tokens", "tokens_evaluated",
              "tokens_predicted", "prompt_n", "cache_n", "predicted_n", "input_tokens", "output_tokens",
              "cache_read_input_tokens", "cache_creation_input_tokens"}
local PATTERNS = {}
for _, k in ipairs(KEYS) do PATTERNS[k] = '"' .. k .. '":(%d+)%D' end
-- bytes of a chunk kept for the next one: a figure or an event's start cut by a chunk boundary is
-- read whole there (the longest figure, key and digits, is under 40 bytes)
local TAIL = 64

local Usage = {id = "voltafleet usage", flags = filter.FLT_CFG_FL_HTX}
Usage.__index = Usage

function Usage:new()
  return setmetatable({tail = "", seen = {}, events = 0, roles = 0, blocks = 0, sse = false, shown = {}, held = 0}, Usage)
end

-- The request side: a body member the gateway adds so that every answer carries the figures.
-- OpenAI-format streams: "timings_per_token":true, so each event carries timings (prompt_n, cache_n,
-- predicted_n), not only the last one (a stream its client cuts counts its prompt). Native routes:
-- "response_fields":[], so a client's response_fields cannot narrow the figures away (the frontend
-- refuses one it sees with a 400 first). The member goes last, before the object's closing brace:
-- llama-server's JSON parser keeps a key's last value, so a client's own value of it is overridden.
local REWRITE = {}
for _, p in ipairs({"/v1/chat/completions", "/chat/completions", "/v1/completions"}) do REWRITE[p] = '"timings_per_token":true' end
for _, p in ipairs({"/completion", "/completions"}) do REWRITE[p] = '"response_fields":[]' end

-- A request path as llama-server's HTTP library decodes it before routing (%XX and %uXXXX, one
-- pass), so a path spelled with escapes is rewritten like the route it reaches.
local function decoded(path)
  local out, i = {}, 1
  while i <= #path do
    local c = path:sub(i, i)
    local u = c == "%" and path:match("^u(%x%x%x%x)", i + 1)
    local x = c == "%" and not u and path:match("^(%x%x)", i + 1)
    if u then out[#out + 1], i = utf8.char(tonumber(u, 16)), i + 6
    elseif x then out[#out + 1], i = string.char(tonumber(x, 16)), i + 3
    else out[#out + 1], i = c, i + 1 end
  end
  return table.concat(out)
end

-- Before the request goes on (an http-request action, vf_rewrite): a POST with a body to one of
-- REWRITE's routes will get its member (txn.vf_member, for the filter), its Content-Length grown by
-- exactly what the body will grow (a chunked body needs none). An action, not the filter's headers
-- callback: once `option http-buffer-request` has waited for the body, HAProxy 2.6 lets a filter's
-- headers callback change no header.
-- How each team route's answer is counted (routes.py's ROUTES): the figures' rules in Usage:figures.
local KIND = {["/v1/chat/completions"] = "chat", ["/chat/completions"] = "chat", ["/v1/completions"] = "oai",
              ["/completion"] = "native", ["/completions"] = "native", ["/v1/messages"] = "anthropic"}

core.register_action("vf_rewrite", {"http-req"}, guard("rewrite", function(txn)
  local path = txn.sf:path() or ""
  txn:set_var("txn.vf_kind", KIND[path] or "request")
  local member = txn.sf:method() == "POST" and REWRITE[decoded(path)]
  if not member then return end
  local h = txn.http:req_get_headers()
  local cl = h["content-length"] and tonumber(h["content-length"][0])
  if cl == 0 or (cl == nil and not h["transfer-encoding"]) then return end
  if cl then txn.http:req_set_header("content-length", string.format("%d", cl + #member + 1)) end
  txn:set_var("txn.vf_member", member)
end), 0)

-- The filter's side of it: the request's body is read for its member's place.
function Usage:plan(txn, msg)
  local member = txn:get_var("txn.vf_member")
  if not member then return end
  self.pair, self.add, self.prev = member, #member + 1, ""
  filter.register_data_filter(self, msg.channel)
end

-- The request's body as it passes: everything up to its last non-space character is forwarded, that
-- character and the spaces after it held back (at most HOLD bytes of spaces: a longer run goes on);
-- at the body's end the member goes before that character when it is the closing brace ('{' before
-- it: the object was empty, no comma). A body that does not end with '}' (not a JSON object: the
-- server refuses it anyway) gets as many spaces, so Content-Length holds; one whose '}' went on
-- before over HOLD bytes of spaces gets the member after it, which the server refuses (a parse error): no
-- request escapes the member.
local HOLD = 4096

function Usage:rewrite(msg)
  if self.pair == nil then return end
  local data = msg:body() or ""
  local last = data:match(".*()%S")
  if not msg:eom() then
    if last == nil or #data - last >= HOLD then
      if last then self.prev = data:sub(last, last) end
      return #data
    end
    self.prev = data:sub(1, last - 1):match(".*(%S)") or self.prev
    return last - 1
  end
  local ok
  if last and data:sub(last, last) == "}" then
    local before = data:sub(1, last - 1):match(".*(%S)") or self.prev
    local member = before == "{" and self.pair .. " " or "," .. self.pair
    ok = msg:set(member .. data:sub(last), last - 1) >= 0
  else
    local gone = last == nil and self.prev == "}"
    ok = msg:append(gone and "," .. self.pair or string.rep(" ", self.add)) >= 0
  end
  if ok then self.pair = nil return end
  -- no room in the buffer yet: what comes before is forwarded, the rewrite tried again next time
  if last then
    self.prev = data:sub(1, last - 1):match(".*(%S)") or self.prev
    return last - 1
  end
  return 0
end

function Usage:start_analyze(txn, chn)
  if chn:is_resp() then filter.register_data_filter(self, chn) end
end

-- The figures a whole answer of each kind must carry (a stream carries them in its events).
local NEEDS = {chat = {"prompt_tokens", "completion_tokens"}, oai = {"prompt_tokens", "completion_tokens"},
               native = {"tokens_evaluated", "tokens_predicted"}, anthropic = {"input_tokens", "output_tokens"}}

-- Only JSON answers and event streams are read; any other answer passes untouched (a token route's
-- 2xx answer of another type was refused by the frontend before its head went out). A whole 2xx JSON
-- answer of a token route is held back by its last byte until its end: without its figures there, that
-- byte goes as a quote, so that no JSON parser takes the answer (its length is kept: the client is not left
-- waiting for a byte), and the gateway's error is counted.
function Usage:headers(txn, msg)
  if not msg.channel:is_resp() then return self:plan(txn, msg) end
  -- the answer's type as vf_check saw it (the headers cannot be read here once wait-for-body ran)
  local ct = txn:get_var("txn.vf_ctype") or ""
  self.sse = ct == "sse"
  self.kind = txn:get_var("txn.vf_kind") or "request"
  self.hold = not self.sse and txn:get_var("txn.vf_hold") ~= nil  -- vf_check: a token route's 2xx answer
  self.held, self.length, self.passed = 0, tonumber(txn:get_var("txn.vf_length")), 0
  if ct ~= "sse" and ct ~= "json" then filter.unregister_data_filter(self, msg.channel) end
end

-- How many times `plain` occurs in data and ends after byte `from` (earlier ones were counted
-- with the previous chunk, whose tail data begins with).
local function count(data, plain, from)
  local n, i = 0, 1
  while true do
    local s, e = data:find(plain, i, true)
    if not s then return n end
    if e > from then n = n + 1 end
    i = e + 1
  end
end

-- The answer's figures so far: the server's own when it sent them (usage, else the native
-- tokens_*, else timings), else the token events forwarded (a stream cut before its last event).
-- /v1/messages (Anthropic): the prompt is input_tokens + cache_read_input_tokens (the server reports
-- the cached part apart); a stream's first event says "output_tokens":0, so its completion is
-- message_delta's output_tokens, or the content_block_delta events forwarded before it.
function Usage:figures()
  local s = self.seen
  if self.kind == "anthropic" then
    local prompt = s.input_tokens and s.input_tokens + (s.cache_read_input_tokens or 0) + (s.cache_creation_input_tokens or 0)
    local completion = (not self.sse or self.delta) and s.output_tokens or nil
    return prompt or 0, completion or self.blocks, 0
  end
  local prompt = s.prompt_tokens or s.tokens_evaluated or s.input_tokens
  if prompt == nil and s.prompt_n then prompt = s.prompt_n + (s.cache_n or 0) end
  local completion = s.completion_tokens or s.tokens_predicted or s.output_tokens or s.predicted_n
  return prompt or 0, completion or math.max(0, self.events - self.roles), s.reasoning_tokens or 0
end

-- Every figure a whole answer of its kind must carry, found?
function Usage:complete()
  for _, k in ipairs(NEEDS[self.kind] or {}) do
    if self.seen[k] == nil then return false end
  end
  return true
end

-- Publish a figure to the transaction (vf_account reads it at log time) when it changed.
function Usage:show(txn, name, value)
  if self.shown[name] ~= value then
    self.shown[name] = value
    txn:set_var("txn.vf_" .. name, value)
  end
end

function Usage:read(txn, chunk)
  local from = #self.tail
  local data = self.tail .. chunk
  if data:find("tokens", 1, true) or data:find('_n"', 1, true) then
    for k, pat in pairs(PATTERNS) do
      for v in data:gmatch(pat) do self.seen[k] = tonumber(v) end
    end
  end
  if self.sse then
    self.events = self.events + count(data, "data: {", from)
    self.roles = self.roles + count(data, '"delta":{"role":"assistant"', from)
    if self.kind == "anthropic" then
      self.blocks = self.blocks + count(data, '"type":"content_block_delta"', from)
      self.delta = self.delta or count(data, '"type":"message_delta"', from) > 0
    end
  end
  self.tail = data:sub(-TAIL)
  local p, c, r = self:figures()
  self:show(txn, "prompt", p)
  self:show(txn, "completion", c)
  self:show(txn, "reasoning", r)
  if self.sse then self:show(txn, "stream", 1) end
end

function Usage:payload(txn, msg)
  if not msg.channel:is_resp() then return self:rewrite(msg) end
  local body = msg:body() or ""
  if #body > self.held then self:read(txn, body:sub(self.held + 1)) end
  if not self.hold then return end
  if not msg:eom() then
    -- the last byte is held back: with a Content-Length only once it has come, so that the filter never
    -- holds a lone byte while the server still sends (a stream of HAProxy 2.6.12 spun at 100 % CPU so, its
    -- one byte held and 406,180 to come); without one, always the last byte so far
    local last = self.length == nil or self.passed + #body >= self.length
    self.held = last and math.min(#body, 1) or 0
    self.passed = self.passed + #body - self.held
    return #body - self.held
  end
  self.hold, self.held = false, 0
  if not self:complete() then
    fail(txn, "count", "a whole answer (" .. self.kind .. ") without the server's figures: its last byte spoilt")
    if #body > 0 then msg:set('"', #body - 1, 1) end
  end
  return #body
end

function Usage:http_headers(txn, msg)
  local ok, err = pcall(self.headers, self, txn, msg)
  if not ok then
    fail(txn, "count", err)
    self.cut = true
    return -1
  end
end

-- Each callback under pcall: an error in the counting counts (stage count) and aborts the answer (a
-- filter error) rather than passing it on uncounted.
function Usage:http_payload(txn, msg)
  local ok, n = pcall(self.payload, self, txn, msg)
  if not ok then
    fail(txn, "count", n)
    return -1
  end
  if self.cut then return -1 end
  if n ~= nil then return n end  -- no value: everything goes (a nil would be read as 0 bytes)
end

-- The answer reached its end: a stream that never gets here was cut (by its client or a dying server).
function Usage:http_end(txn, msg)
  if self.cut then return -1 end
  if msg.channel:is_resp() then txn:set_var("txn.vf_end", 1) end
end

-- A whole answer the frontend waited for (wait-for-body): a token route's 2xx answer that is not JSON or
-- an event stream, or whose complete JSON body lacks its figures, is refused (txn.vf_error: the frontend's 503).
core.register_action("vf_check", {"http-res"}, guard("count", function(txn)
  local ct = txn.f:res_hdr("content-type") or ""
  local sse = ct:find("text/event-stream", 1, true) ~= nil
  txn:set_var("txn.vf_ctype", sse and "sse" or ct:find("json", 1, true) and "json" or "other")
  local kind = txn:get_var("txn.vf_kind")
  if NEEDS[kind] == nil or txn:get_var("txn.vf_error") then return end
  local code = txn.f:status() or 0
  if code < 200 or code >= 300 or sse then return end
  txn:set_var("txn.vf_hold", 1)
  if not ct:find("json", 1, true) then return fail(txn, "count", "a " .. kind .. " answer of type '" .. ct .. "'") end
  local body, cl = txn.f:res_body() or "", tonumber(txn.f:res_hdr("content-length") or "")
  if cl then txn:set_var("txn.vf_length", cl) end  -- the filter holds back the answer's last byte alone
  if cl == nil or #body < cl then return end  -- not whole in the buffer: the filter checks it as it passes
  for _, k in ipairs(NEEDS[kind]) do
    if not body:find(PATTERNS[k]) then return fail(txn, "count", "a whole " .. kind .. " answer without " .. k) end
  end
end), 0)

core.register_filter("vf_usage", Usage, function(u, args) return u end)

-- Token budgets per team (issue 39 item 3; voltafleet/front/budgets.py is the specification). Every
-- request's prompt + completion tokens are appended as one line `<team> <tokens> <worker pid>` to the UTC
-- day's file in BUDGET_DIR (O_APPEND, one write: lines of an old and a new worker alive at once during a
-- reload never mix). Nothing slow runs in a request (issue 48): the worker's figures (`book`) live in
-- memory; a background task (one a worker) loads the month's days at start, reads the day's file as other
-- workers' lines arrive, and compacts old days, its file reads in pieces that give the thread back between
-- them. A budget check reads memory only; a request's own tokens are added to memory as it is logged (and its
-- line, tagged with this worker's pid, is skipped when the file is read back). The files are touched only in
-- the worker (user haproxy), never in the master, which runs this file's body at start as root.
local BUDGET_DIR = os.getenv("VOLTAFLEET_BUDGET_DIR") or "/var/lib/haproxy/voltafleet-budgets"
local BUDGETS_MAP = os.getenv("VOLTAFLEET_BUDGETS_MAP") or "/etc/haproxy/voltafleet-team-budgets.map"
local PIECE = 65536  -- bytes of a file read before the task gives the thread back
local TICK_MS = 200  -- the task's period: other workers' lines reach this one's figures within it
-- ready: the month loaded; failed: why it could not be (the budgets are refused meanwhile); day, month: the
-- UTC day and month the figures are of; base: {team: tokens of the month before today}; today: {team: tokens};
-- pos, partial: how far the day's file was read (bytes, an unfinished last line); prev: the same for the
-- previous day's file, still to be read to its end into base; compact: set when a day ended (compact old days)
local book = {ready = false, failed = nil, base = {}, today = {}, partial = "", pos = 0}
local ME = nil  -- this worker's pid (read in the worker: the master loads this file)
local appender = {day = nil, f = nil}  -- this worker's append handle on the day's file

local function day_of(t) return os.date("!%Y-%m-%d", t) end
local function month_of(t) return os.date("!%Y-%m", t) end

-- The UTC epoch second a period holding t ends (the next day's or month's 00:00:00 UTC).
local function reset_at(t, period)
  if period == "day" then return t - t % 86400 + 86400 end
  local d = os.date("!*t", t)
  local y, m = d.year, d.month + 1
  if m == 13 then y, m = y + 1, 1 end
  -- days from 1970-01-01 to y-m-01 (Howard Hinnant's days_from_civil)
  local yy = m <= 2 and y - 1 or y
  local era = yy // 400
  local yoe = yy - era * 400
  local doy = (153 * (m + (m > 2 and -3 or 9)) + 2) // 5
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  return (era * 146097 + doe - 719468) * 86400
end

-- Whole lines of text added into `into` ({team: tokens}); a line tagged with `skip` (this worker's own,
-- already counted as it was logged) is left out.
local function add(into, text, skip)
  for team, n, pid in text:gmatch("([^ \n]+) (%d+) ?([^ \n]*)\n") do
    if skip == nil or pid ~= skip then into[team] = (into[team] or 0) + tonumber(n) end
  end
end

local function worker_id()
  local f = io.open("/proc/self/stat", "r")
  local pid = f and f:read("n")
  if f then f:close() end
  return tostring(pid or math.random(1, 1 << 30))
end

-- A file's whole lines from byte `pos` on, read in pieces with the thread given back between them:
-- (the text of whole lines, the new position, the unfinished rest). nil, err: it cannot be read (a
-- missing file is empty).
local function read_from(path, pos, partial)
  local f, err = io.open(path, "r")
  if not f then
    if err and err:find("No such file", 1, true) then return "", pos, partial end
    return nil, err
  end
  f:seek("set", pos)
  local parts = {partial}
  while true do
    local piece, rerr = f:read(PIECE)
    if piece == nil then
      if rerr then f:close() return nil, rerr end
      break
    end
    parts[#parts + 1] = piece
    pos = pos + #piece
    core.yield()
  end
  f:close()
  local data = table.concat(parts)
  local cut = data:match(".*\n()")
  if not cut then return "", pos, data end
  return data:sub(1, cut - 1), pos, data:sub(cut)
end

-- read_from, or an error naming the file (the task's pcall counts it: budget_files).
local function lines_of(path, pos, partial)
  local text, newpos, rest = read_from(path, pos or 0, partial or "")
  if text == nil then error("cannot read " .. path .. ": " .. tostring(newpos)) end
  return text, newpos, rest
end

-- A day that ended over a day ago is never written again: its lines become one a team in <day>.sum
-- (written aside, renamed), then its .log goes; readers take the .log while it exists. Returns its sums.
local function compact(name)
  local text = lines_of(name .. ".log")
  local s = {}
  add(s, text)
  if text == "" then return s end
  local lines = {}
  for team, n in pairs(s) do lines[#lines + 1] = string.format("%s %d\n", team, n) end
  local tmp = name .. ".sum." .. (ME or worker_id())
  local f = io.open(tmp, "w")
  if not f then return s end
  f:write(table.concat(lines))
  f:close()
  if os.rename(tmp, name .. ".sum") then os.remove(name .. ".log") else os.remove(tmp) end
  return s
end

local function day_name(y, m, d) return string.format("%s/%04d-%02d-%02d", BUDGET_DIR, y, m, d) end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

-- The month's days before today, {team: tokens}: each day from its .sum, else its .log (compacted first
-- when it is older than yesterday); the previous month's files removed. Runs in the task; only_compact:
-- the compaction and the removal alone (the sums are in memory already).
local function month_before_today(now, only_compact)
  local d = os.date("!*t", now)
  local base = {}
  for i = 1, d.day - 1 do
    local name = day_name(d.year, d.month, i)
    local log = exists(name .. ".log")
    if not log and exists(name .. ".sum") then
      if not only_compact then add(base, (lines_of(name .. ".sum"))) end
    elseif i < d.day - 1 then
      if log then
        for t, n in pairs(compact(name)) do base[t] = (base[t] or 0) + n end
      end
    elseif not only_compact then
      add(base, (lines_of(name .. ".log")))
    end
  end
  local py, pm = d.year, d.month - 1
  if pm == 0 then py, pm = py - 1, 12 end
  for i = 1, 31 do
    local name = day_name(py, pm, i)
    os.remove(name .. ".log")
    os.remove(name .. ".sum")
  end
  return base
end

-- A new UTC day (or month) begun, in memory only (a request may call it): today's figures go into the
-- month's (or a new month starts empty); the file of the day that ended is read to its end by the task.
local function roll(now)
  local day = day_of(now)
  if book.day == day then return end
  if month_of(now) == book.month then
    for t, n in pairs(book.today) do book.base[t] = (book.base[t] or 0) + n end
    book.prev = {day = book.day, pos = book.pos, partial = book.partial}
  else
    book.base, book.prev = {}, nil
  end
  book.compact = book.day
  book.day, book.month, book.today, book.pos, book.partial = day, month_of(now), {}, 0, ""
end

-- The task's round: load the month at start; then other workers' new lines, the day that ended read to
-- its end, the compaction of the day before yesterday.
local function tick()
  ME = ME or worker_id()
  local now = os.time()
  if not book.ready then
    local base = month_before_today(now)
    local today = {}
    local text, pos, partial = lines_of(BUDGET_DIR .. "/" .. day_of(now) .. ".log")
    add(today, text)
    book.day, book.month, book.base, book.today, book.pos, book.partial = day_of(now), month_of(now), base, today, pos, partial
    book.ready, book.failed = true, nil
    return
  end
  if book.day ~= day_of(now) then roll(now) end
  if book.prev then
    local p = book.prev
    local text = lines_of(BUDGET_DIR .. "/" .. p.day .. ".log", p.pos, p.partial)
    if book.prev == p then add(book.base, text, ME) end
    book.prev = nil
  end
  local day = book.day
  local text, pos, partial = lines_of(BUDGET_DIR .. "/" .. day .. ".log", book.pos, book.partial)
  if book.day == day then
    add(book.today, text, ME)
    book.pos, book.partial = pos, partial
  end
  if book.compact then
    book.compact = nil
    month_before_today(now, true)  -- the day before yesterday compacted (its sums are in base already)
  end
end

core.register_task(function()
  while true do
    local ok, err = pcall(tick)
    if not ok then
      book.failed = tostring(err)
      if book.ready then book.ready = false; book.base, book.today, book.pos, book.partial, book.prev = {}, {}, 0, "", nil end
      alert("budget_files", err)
    end
    core.msleep(ok and TICK_MS or 1000)
  end
end)

-- Append a request's tokens to the day's file (one write of one line, O_APPEND) and to this worker's
-- figures. A file that cannot be opened or written is tried again on the next request, the error counted.
local function record(team, tokens)
  if tokens <= 0 or team == "-" then return end
  ME = ME or worker_id()
  local now = os.time()
  if book.ready then
    roll(now)
    book.today[team] = (book.today[team] or 0) + tokens
  end
  local day = day_of(now)
  if appender.day ~= day or appender.f == nil then
    if appender.f then appender.f:close() end
    local f, err = io.open(BUDGET_DIR .. "/" .. day .. ".log", "a")
    if f then f:setvbuf("full", 4096) end
    appender.day, appender.f = day, f
    if not f then error("cannot append to the day's file: " .. tostring(err)) end
  end
  local ok, err = appender.f:write(team, " ", string.format("%d", tokens), " ", ME, "\n")
  if ok then ok, err = appender.f:flush() end
  if not ok then
    appender.f:close()
    appender.f = nil
    error("cannot write the day's file: " .. tostring(err))
  end
end

-- A map value that must be a whole number ("0": no budget for that period); anything else is an error.
local function whole(v)
  if v == nil then return 0 end
  if not tostring(v):match("^%d+$") then error("a budget that is not a whole number: '" .. tostring(v) .. "'") end
  return tonumber(v)
end

-- Two gateways or more behind one address (issue 52; voltafleet/front/pair.py, voltafleet/front/budgets.py's
-- spent_text): this gateway answers its own counts to the others (vf_budget_spent, on the budget port that only
-- their addresses reach), and a task reads theirs every PEER_POLL_MS; a budget check adds them to its own. A
-- peer's last counts are kept in BUDGET_DIR/peer-<name> (written aside, renamed), so a gateway that restarts
-- while its peer is down still counts what the peer served. A peer that cannot be read keeps its last counts;
-- voltafleet_gateway_budget_peer_age_seconds says how old they are.
local PEERS = {}
for name, url in (os.getenv("VOLTAFLEET_BUDGET_PEERS") or ""):gmatch("([^ =]+)=([^ ]+)") do
  PEERS[#PEERS + 1] = {name = name, url = url}
end
local PEER_POLL_MS = tonumber(os.getenv("VOLTAFLEET_BUDGET_PEER_POLL_MS") or "1000") or 1000
local peer_book = {}  -- {name: {day, month, today = {team: n}, month_total = {team: n}, at = epoch s, text}}

-- This gateway's own counts: "day <YYYY-MM-DD>\nmonth <YYYY-MM>\n<team> <day tokens> <month tokens>\n"...
local function spent_text()
  local out = {"day " .. book.day, "month " .. book.month}
  local seen = {}
  for _, src in ipairs({book.today, book.base}) do
    for t in pairs(src) do
      if not seen[t] then
        seen[t] = true
        local day = book.today[t] or 0
        out[#out + 1] = string.format("%s %d %d", t, day, (book.base[t] or 0) + day)
      end
    end
  end
  return table.concat(out, "\n") .. "\n"
end

local function parse_spent(text)
  local day, month = text:match("^day (%d%d%d%d%-%d%d%-%d%d)\nmonth (%d%d%d%d%-%d%d)\n")
  if not day then error("not a gateway's token counts") end
  local got = {day = day, month = month, today = {}, month_total = {}, text = text}
  for team, d, m in text:gmatch("\n([^ \n]+) (%d+) (%d+)") do
    got.today[team], got.month_total[team] = tonumber(d), tonumber(m)
  end
  return got
end

local function keep_peer(name, text)
  local path = BUDGET_DIR .. "/peer-" .. name
  local f = io.open(path .. ".tmp", "w")
  if not f then error("cannot write " .. path .. ".tmp") end
  f:write(text)
  f:close()
  if not os.rename(path .. ".tmp", path) then error("cannot rename " .. path .. ".tmp") end
end

-- A team's use as its budget counts it: this gateway's and every peer's counts of the same UTC day and month.
local function used_of(team)
  local day = book.today[team] or 0
  local month = (book.base[team] or 0) + day
  for _, p in pairs(peer_book) do
    if p.day == book.day then day = day + (p.today[team] or 0) end
    if p.month == book.month then month = month + (p.month_total[team] or 0) end
  end
  return {day = day, month = month}
end

if #PEERS > 0 then
  core.register_task(function()
    for _, p in ipairs(PEERS) do  -- the last counts kept before a restart
      local ok, got = pcall(function() return parse_spent(lines_of(BUDGET_DIR .. "/peer-" .. p.name)) end)
      if ok then got.at = 0; peer_book[p.name] = got end
    end
    while true do
      for _, p in ipairs(PEERS) do
        local ok, err = pcall(function()
          local r = core.httpclient():get{url = p.url, timeout = math.max(PEER_POLL_MS, 500)}
          if not r or r.status ~= 200 then error("answered " .. tostring(r and r.status)) end
          local got = parse_spent(r.body)
          got.at = os.time()
          if not peer_book[p.name] or peer_book[p.name].text ~= got.text then keep_peer(p.name, got.text) end
          peer_book[p.name] = got
        end)
        if not ok then alert("budget_peer " .. p.name, err) end
      end
      core.msleep(PEER_POLL_MS)
    end
  end)
end

core.register_service("vf_budget_spent", "http", function(applet)
  local ok, body = pcall(function()
    if not book.ready then error("not loaded") end
    roll(os.time())
    return spent_text()
  end)
  applet:set_status(ok and 200 or 503)
  body = ok and body or "not ready\n"
  applet:add_header("content-type", "text/plain")
  applet:add_header("content-length", tostring(string.len(body)))
  applet:start_response()
  applet:send(body)
end)

-- Before every team's request: a team with a budget (txn.budget_day, txn.budget_month: its map entry) whose
-- use in the UTC day or month reached it gets txn.vf_budget_body and txn.vf_budget_retry (the frontend's
-- 429). txn.vf_budget_ok says the check was made; budgets still loading or unreadable are refused (503).
core.register_action("vf_budget", {"http-req"}, guard("budget", function(txn)
  local team = txn:get_var("txn.team")
  local budget = {day = whole(txn:get_var("txn.budget_day")), month = whole(txn:get_var("txn.budget_month"))}
  if team == nil then error("no team") end
  if budget.day <= 0 and budget.month <= 0 then
    txn:set_var("txn.vf_budget_ok", 1)
    return
  end
  if not book.ready then
    if book.failed then return fail(txn, "budget_files", book.failed) end
    return txn:set_var("txn.vf_error", "budget_loading")
  end
  local now = os.time()
  roll(now)
  local used = used_of(team)
  local period = nil
  for _, p in ipairs({"month", "day"}) do
    if period == nil and budget[p] > 0 and used[p] >= budget[p] then period = p end
  end
  txn:set_var("txn.vf_budget_ok", 1)
  if period == nil then return end
  local at = reset_at(now, period)
  txn:set_var("txn.vf_budget_retry", math.max(1, at - now))
  txn:set_var("txn.vf_budget_body", string.format(
    '{"error":{"message":"Your team %s has used %d of its %s budget of %d tokens (prompt + completion, UTC %s): '
    .. 'it resets at %s","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}',
    team, used[period], period == "day" and "daily" or "monthly", budget[period], period, os.date("!%Y-%m-%dT%H:%M:%SZ", at)))
end), 0)

local function slurp(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

-- {team: {day = n, month = n}} from BUDGETS_MAP's file (the running map is brought to it by each run).
local function budgets()
  local t = {}
  for team, d, m in (slurp(BUDGETS_MAP) or ""):gmatch("([^ \t\n#]+)[ \t]+(%d+)[ \t]+(%d+)") do
    t[team] = {day = tonumber(d), month = tonumber(m)}
  end
  return t
end

local function account(txn)
  local team = txn:get_var("txn.team") or "-"
  local u = usage[team]
  if u == nil then
    u = {requests = 0, codes = {}, ms = 0, prompt = 0, completion = 0, reasoning = 0, cut = 0}
    usage[team] = u
  end
  local code = tostring(txn:get_var("txn.status") or 0)
  u.requests = u.requests + 1
  u.codes[code] = (u.codes[code] or 0) + 1
  local t0 = tonumber(txn:get_var("txn.t0"))
  if t0 then u.ms = u.ms + math.max(0, now_ms() - t0) end
  local prompt = tonumber(txn:get_var("txn.vf_prompt")) or 0
  local completion = tonumber(txn:get_var("txn.vf_completion")) or 0
  u.prompt = u.prompt + prompt
  u.completion = u.completion + completion
  u.reasoning = u.reasoning + (tonumber(txn:get_var("txn.vf_reasoning")) or 0)
  if txn:get_var("txn.vf_stream") and not txn:get_var("txn.vf_end") then u.cut = u.cut + 1 end
  local stage = txn:get_var("txn.vf_error")
  if stage then errors[stage] = (errors[stage] or 0) + 1 end
  local ok, err = pcall(record, team, prompt + completion)
  if not ok then
    errors.record = errors.record + 1
    alert("record", err)
  end
  return team
end

-- Counted once a request, as HAProxy logs it (the frontend's log-format calls it).
core.register_fetches("vf_account", function(txn)
  local ok, team = pcall(account, txn)
  if ok then return team end
  errors.account = errors.account + 1
  alert("account", team)
  return "-"
end)

local function metric(out, name, help, kind)
  out[#out + 1] = "# HELP " .. name .. " " .. help
  out[#out + 1] = "# TYPE " .. name .. " " .. kind
end

-- One counter a team: each team's usage field, whole (seconds: from milliseconds, to the millisecond).
local function counter(out, teams, name, field, help)
  metric(out, name, help, "counter")
  for _, t in ipairs(teams) do
    local v = usage[t][field]
    local text = field == "ms" and string.format("%.3f", v / 1000) or string.format("%d", v)
    out[#out + 1] = string.format('%s{team="%s"} %s', name, t, text)
  end
end

-- The gateway's own errors by stage (each refused its request: 503, or an answer cut) and whether the
-- budgets' figures are loaded.
local function error_metrics(out)
  metric(out, "voltafleet_gateway_errors_total", "Requests the gateway refused (503 gateway_error) or cut because one "
         .. "of its own stages failed: limits (a team's limits unreadable), budget (the check failed), budget_files "
         .. "(the day files unreadable), budget_loading (a starting worker still reading them), rewrite, count (an "
         .. "answer it could not count), record (a day file not written), account (the counting at log time)", "counter")
  local stages = {}
  for stage in pairs(errors) do stages[#stages + 1] = stage end
  table.sort(stages)
  for _, stage in ipairs(stages) do
    out[#out + 1] = string.format('voltafleet_gateway_errors_total{stage="%s"} %d', stage, errors[stage])
  end
  metric(out, "voltafleet_gateway_budgets_ready", "1 once this worker read the month's token counts (budgeted teams are "
         .. "refused with 503 until then), 0 while it reads them or cannot", "gauge")
  out[#out + 1] = string.format("voltafleet_gateway_budgets_ready %d", book.ready and 1 or 0)
end

-- Each team's budgets (BUDGETS_MAP) and its use in the current UTC day and month (the files' figures).
local function budget_metrics(out)
  if book.ready then roll(os.time()) end
  local b, limits = book.ready and book or {today = {}, base = {}}, budgets()
  local names, seen = {}, {}
  for _, src in ipairs({limits, b.today, b.base}) do
    for t in pairs(src) do
      if not seen[t] then seen[t] = true; names[#names + 1] = t end
    end
  end
  table.sort(names)
  metric(out, "voltafleet_team_budget_tokens", "A team's token budget (gateway_teams tokens_per_day, tokens_per_month): "
         .. "prompt + completion tokens a UTC day or calendar month; over it, 429 insufficient_quota until the reset", "gauge")
  for _, t in ipairs(names) do
    for _, p in ipairs({"day", "month"}) do
      local v = limits[t] and limits[t][p] or 0
      if v > 0 then out[#out + 1] = string.format('voltafleet_team_budget_tokens{team="%s",period="%s"} %d', t, p, v) end
    end
  end
  metric(out, "voltafleet_team_budget_used_tokens", "A team's prompt + completion tokens (reasoning inside completion) in "
         .. "the current UTC day or calendar month, as its budget counts them: every answer's figures (see "
         .. "voltafleet_team_prompt_tokens_total), each request at the moment it was logged; kept in files across "
         .. "reloads and restarts; resets at 00:00 UTC (day) and on the 1st 00:00 UTC (month)", "gauge")
  for _, t in ipairs(names) do
    local u = book.ready and used_of(t) or {day = 0, month = 0}
    out[#out + 1] = string.format('voltafleet_team_budget_used_tokens{team="%s",period="day"} %d', t, u.day)
    out[#out + 1] = string.format('voltafleet_team_budget_used_tokens{team="%s",period="month"} %d', t, u.month)
  end
  if #PEERS > 0 then
    metric(out, "voltafleet_gateway_budget_peer_age_seconds", "Seconds since this gateway last read another gateway's "
           .. "token counts (its budgets count them); a dead peer's last counts are kept and grow old", "gauge")
    for _, p in ipairs(PEERS) do
      local at = peer_book[p.name] and peer_book[p.name].at or 0
      out[#out + 1] = string.format('voltafleet_gateway_budget_peer_age_seconds{peer="%s"} %d', p.name,
                                    at > 0 and os.time() - at or os.time())
    end
  end
  metric(out, "voltafleet_team_budget_reset_timestamp_seconds", "When the current UTC day or month ends (its budgets reset), Unix time", "gauge")
  local now = os.time()
  for _, p in ipairs({"day", "month"}) do
    out[#out + 1] = string.format('voltafleet_team_budget_reset_timestamp_seconds{period="%s"} %d', p, reset_at(now, p))
  end
end

core.register_service("vf_team_metrics", "http", function(applet)
  local out = {}
  local teams = {}
  for team in pairs(usage) do teams[#teams + 1] = team end
  table.sort(teams)
  counter(out, teams, "voltafleet_team_requests_total", "requests",
          "Requests a team sent through the gateway (team - : no known key)")
  metric(out, "voltafleet_team_responses_total", "Answers to a team by HTTP status (401, 429, 503 from the gateway itself)", "counter")
  for _, t in ipairs(teams) do
    local codes = {}
    for c in pairs(usage[t].codes) do codes[#codes + 1] = c end
    table.sort(codes)
    for _, c in ipairs(codes) do
      out[#out + 1] = string.format('voltafleet_team_responses_total{team="%s",code="%s"} %d', t, c, usage[t].codes[c])
    end
  end
  counter(out, teams, "voltafleet_team_request_seconds_total", "ms",
          "Seconds a team's requests took, each from arrival to its last byte")
  counter(out, teams, "voltafleet_team_prompt_tokens_total", "prompt",
          "Prompt tokens of a team's answers, streamed or not, as llama-server reports them in the answer "
          .. "(usage.prompt_tokens; native /completion: tokens_evaluated; a chat or completions stream without "
          .. "include_usage: timings.cache_n + timings.prompt_n, in every event since the gateway adds "
          .. "timings_per_token), cached ones included; a stream its client cuts counts it from its first token")
  counter(out, teams, "voltafleet_team_completion_tokens_total", "completion",
          "Completion tokens of a team's answers, streamed or not, of any size, as llama-server reports them "
          .. "in the answer (usage.completion_tokens; native /completion: tokens_predicted; a chat or completions "
          .. "stream without include_usage: timings.predicted_n), reasoning included; a stream cut before its last "
          .. "event: the figure of the last event the gateway forwarded (other formats: one a text event)")
  counter(out, teams, "voltafleet_team_reasoning_tokens_total", "reasoning",
          "Reasoning tokens of a team's answers where llama-server reports them "
          .. "(usage.completion_tokens_details.reasoning_tokens; also counted in completion tokens)")
  counter(out, teams, "voltafleet_team_cut_streams_total", "cut",
          "A team's streamed answers that ended before their last event (the client left, or a server died)")
  local live = core.backends[TABLE].stktable:dump()
  local names = {}
  for t in pairs(live) do names[#names + 1] = t end
  table.sort(names)
  metric(out, "voltafleet_team_in_flight", "A team's requests in flight now (its concurrent limit counts these)", "gauge")
  for _, t in ipairs(names) do
    out[#out + 1] = string.format('voltafleet_team_in_flight{team="%s"} %d', t, live[t].conn_cur or 0)
  end
  metric(out, "voltafleet_team_requests_per_minute", "A team's requests over the last minute (its rate limit counts these)", "gauge")
  for _, t in ipairs(names) do
    out[#out + 1] = string.format('voltafleet_team_requests_per_minute{team="%s"} %d', t, live[t].http_req_rate or 0)
  end
  metric(out, "voltafleet_team_bytes_out_total", "Bytes the gateway sent a team's clients", "counter")
  for _, t in ipairs(names) do
    out[#out + 1] = string.format('voltafleet_team_bytes_out_total{team="%s"} %d', t, live[t].bytes_out_cnt or 0)
  end
  budget_metrics(out)
  error_metrics(out)
  local body = table.concat(out, "\n") .. "\n"
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", tostring(string.len(body)))
  applet:start_response()
  applet:send(body)
end)
