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

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec // 1000
end

-- llama-server's figures, each a JSON key followed by a whole number. The key with its closing
-- quote and colon never occurs inside a JSON string (a quote there is escaped), so a model's
-- text cannot forge one; "prompt_tokens": does not match "prompt_tokens_details". A figure is
-- taken once its number is followed by another character (never cut by a chunk's end).
local KEYS = {"prompt_tokens", "completion_tokens", "reasoning_tokens", "tokens_evaluated",
              "tokens_predicted", "prompt_n", "cache_n", "predicted_n", "input_tokens", "output_tokens"}
local PATTERNS = {}
for _, k in ipairs(KEYS) do PATTERNS[k] = '"' .. k .. '":(%d+)%D' end
-- bytes of a chunk kept for the next one: a figure or an event's start cut by a chunk boundary is
-- read whole there (the longest figure, key and digits, is under 40 bytes)
local TAIL = 64

local Usage = {id = "voltafleet usage", flags = filter.FLT_CFG_FL_HTX}
Usage.__index = Usage

function Usage:new()
  return setmetatable({tail = "", seen = {}, events = 0, roles = 0, sse = false, shown = {}}, Usage)
end

-- The request side: a body member the gateway adds so that every answer carries the figures.
-- OpenAI-format streams: "timings_per_token":true, so each event carries timings (prompt_n, cache_n,
-- predicted_n), not only the last one (a stream its client cuts counts its prompt). Native routes:
-- "response_fields":[], so a client's response_fields cannot narrow the figures away (the frontend
-- refuses one it sees with a 400 first). The member goes last, before the object's closing brace:
-- llama-server's JSON parser keeps a key's last value, so a client's own value of it is overridden.
local REWRITE = {}
for _, p in ipairs({"/v1/chat/completions", "/chat/completions", "/v1/completions"}) do REWRITE[p] = '"timings_per_token":true' end
for _, p in ipairs({"/completion", "/completions", "/infill"}) do REWRITE[p] = '"response_fields":[]' end

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
core.register_action("vf_rewrite", {"http-req"}, function(txn)
  local member = txn.sf:method() == "POST" and REWRITE[decoded(txn.sf:path() or "")]
  if not member then return end
  local h = txn.http:req_get_headers()
  local cl = h["content-length"] and tonumber(h["content-length"][0])
  if cl == 0 or (cl == nil and not h["transfer-encoding"]) then return end
  if cl then txn.http:req_set_header("content-length", string.format("%d", cl + #member + 1)) end
  txn:set_var("txn.vf_member", member)
end, 0)

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

-- Only JSON answers and event streams are read; any other answer passes untouched.
function Usage:http_headers(txn, msg)
  if not msg.channel:is_resp() then return self:plan(txn, msg) end
  local ct = (msg:get_headers()["content-type"] or {})[0] or ""
  self.sse = ct:find("text/event-stream", 1, true) ~= nil
  if not self.sse and not ct:find("json", 1, true) then filter.unregister_data_filter(self, msg.channel) end
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
function Usage:figures()
  local s = self.seen
  local prompt = s.prompt_tokens or s.tokens_evaluated or s.input_tokens
  if prompt == nil and s.prompt_n then prompt = s.prompt_n + (s.cache_n or 0) end
  local completion = s.completion_tokens or s.tokens_predicted or s.output_tokens or s.predicted_n
  return prompt or 0, completion or math.max(0, self.events - self.roles), s.reasoning_tokens or 0
end

-- Publish a figure to the transaction (vf_account reads it at log time) when it changed.
function Usage:show(txn, name, value)
  if self.shown[name] ~= value then
    self.shown[name] = value
    txn:set_var("txn.vf_" .. name, value)
  end
end

function Usage:http_payload(txn, msg)
  if not msg.channel:is_resp() then return self:rewrite(msg) end
  local chunk = msg:body()
  if chunk == nil or #chunk == 0 then return end
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
  end
  self.tail = data:sub(-TAIL)
  local p, c, r = self:figures()
  self:show(txn, "prompt", p)
  self:show(txn, "completion", c)
  self:show(txn, "reasoning", r)
  if self.sse then self:show(txn, "stream", 1) end
end

-- The answer reached its end: a stream that never gets here was cut (by its client or a dying server).
function Usage:http_end(txn, msg)
  if msg.channel:is_resp() then txn:set_var("txn.vf_end", 1) end
end

core.register_filter("vf_usage", Usage, function(u, args) return u end)

-- Token budgets per team (issue 39 item 3; voltafleet/budgets.py is the specification). Every
-- request's prompt + completion tokens are appended as one line `<team> <tokens>` to the UTC
-- day's file in BUDGET_DIR (O_APPEND, one write: lines of an old and a new worker alive at once
-- during a reload never mix); each worker reads that file as it grows, its own lines and any
-- other worker's, so its figures are the file's. A starting worker (a reload, a restart) reads
-- the month's days first. The files are touched only in the worker (user haproxy), never in the
-- master, which runs this file's body at start as root.
local BUDGET_DIR = os.getenv("VOLTAFLEET_BUDGET_DIR") or "/var/lib/haproxy/voltafleet-budgets"
local BUDGETS_MAP = os.getenv("VOLTAFLEET_BUDGETS_MAP") or "/etc/haproxy/voltafleet-team-budgets.map"
local book = nil  -- {day, month, base = {team: tokens of the month before today}, today = {team: tokens}, rd, partial}
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

local function add(into, text)
  for team, n in text:gmatch("([^ \n]+) (%d+)\n") do into[team] = (into[team] or 0) + tonumber(n) end
end

local function slurp(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

local function worker_id()
  local f = io.open("/proc/self/stat", "r")
  local pid = f and f:read("n")
  if f then f:close() end
  return tostring(pid or math.random(1, 1 << 30))
end

-- A day that ended over a day ago is never written again: its lines become one a team in
-- <day>.sum (written aside, renamed), then its .log goes; readers take the .log while it exists.
local function compact(base)
  local text = slurp(base .. ".log")
  if not text then return end
  local s = {}
  add(s, text)
  local lines = {}
  for team, n in pairs(s) do lines[#lines + 1] = string.format("%s %d\n", team, n) end
  local tmp = base .. ".sum." .. worker_id()
  local f = io.open(tmp, "w")
  if not f then return end
  f:write(table.concat(lines))
  f:close()
  if os.rename(tmp, base .. ".sum") then os.remove(base .. ".log") else os.remove(tmp) end
end

-- The month's days before today, each from its .log while it exists, else its .sum; days older
-- than yesterday compacted first; the previous month's files removed.
local function month_before_today(now)
  local d = os.date("!*t", now)
  local base = {}
  for i = 1, d.day - 1 do
    local name = string.format("%s/%04d-%02d-%02d", BUDGET_DIR, d.year, d.month, i)
    if i < d.day - 1 then compact(name) end
    add(base, slurp(name .. ".log") or slurp(name .. ".sum") or "")
  end
  local py, pm = d.year, d.month - 1
  if pm == 0 then py, pm = py - 1, 12 end
  for i = 1, 31 do
    local name = string.format("%s/%04d-%02d-%02d", BUDGET_DIR, py, pm, i)
    os.remove(name .. ".log")
    os.remove(name .. ".sum")
  end
  return base
end

-- Read what the day's file gained since the last read (any worker's lines); a line seen half
-- written waits for its end.
local function drain(b)
  if b.rd == nil then b.rd = io.open(BUDGET_DIR .. "/" .. b.day .. ".log", "r") end
  if b.rd == nil then return end
  local data = b.rd:read("a")
  if data == nil or #data == 0 then return end
  data = b.partial .. data
  local cut = data:match(".*\n()")
  if cut then
    add(b.today, data:sub(1, cut - 1))
    b.partial = data:sub(cut)
  else
    b.partial = data
  end
end

-- This worker's figures brought to the files now: loaded at its first use, the day's new lines
-- read, a new day (or month) begun when the UTC date changed.
local function sync()
  local now = os.time()
  local day = day_of(now)
  if book == nil then
    book = {day = day, month = month_of(now), base = month_before_today(now), today = {}, partial = ""}
  elseif book.day ~= day then
    drain(book)
    if book.rd then book.rd:close() end
    if month_of(now) == book.month then
      for t, n in pairs(book.today) do book.base[t] = (book.base[t] or 0) + n end
    else
      book.base = {}
    end
    book.day, book.month, book.today, book.partial, book.rd = day, month_of(now), {}, "", nil
    month_before_today(now)  -- compaction and the old month's removal (its sums are already in base)
  end
  drain(book)
  return book
end

-- Append a request's tokens to the day's file: one write of one line (O_APPEND). A file that
-- cannot be opened is tried again on the next request, said once a day in HAProxy's log.
local function record(team, tokens)
  if tokens <= 0 or team == "-" then return end
  local day = day_of(os.time())
  if appender.day ~= day or appender.f == nil then
    if appender.f then appender.f:close() end
    local path = BUDGET_DIR .. "/" .. day .. ".log"
    local f, err = io.open(path, "a")
    if f then
      f:setvbuf("full", 4096)
    elseif appender.day ~= day then
      core.Alert("voltafleet: token budgets not kept, cannot append to " .. path .. ": " .. tostring(err))
    end
    appender.day, appender.f = day, f
  end
  if appender.f then
    appender.f:write(team, " ", string.format("%d", tokens), "\n")
    appender.f:flush()
  end
end

-- Before a request of a team with a budget (txn.budget_day, txn.budget_month: its map entry):
-- when its use in the UTC day or month reached the budget, txn.vf_budget_body and
-- txn.vf_budget_retry are set and the frontend answers 429 with them.
core.register_action("vf_budget", {"http-req"}, function(txn)
  local team = txn:get_var("txn.team")
  local budget = {day = tonumber(txn:get_var("txn.budget_day")) or 0,
                  month = tonumber(txn:get_var("txn.budget_month")) or 0}
  if team == nil or (budget.day <= 0 and budget.month <= 0) then return end
  local b = sync()
  local used = {day = b.today[team] or 0}
  used.month = (b.base[team] or 0) + used.day
  local period = nil
  for _, p in ipairs({"month", "day"}) do
    if period == nil and budget[p] > 0 and used[p] >= budget[p] then period = p end
  end
  if period == nil then return end
  local now = os.time()
  local at = reset_at(now, period)
  txn:set_var("txn.vf_budget_retry", math.max(1, at - now))
  txn:set_var("txn.vf_budget_body", string.format(
    '{"error":{"message":"Your team %s has used %d of its %s budget of %d tokens (prompt + completion, UTC %s): '
    .. 'it resets at %s","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}',
    team, used[period], period == "day" and "daily" or "monthly", budget[period], period, os.date("!%Y-%m-%dT%H:%M:%SZ", at)))
end, 0)

-- {team: {day = n, month = n}} from BUDGETS_MAP's file (the running map is brought to it by each run).
local function budgets()
  local t = {}
  for team, d, m in (slurp(BUDGETS_MAP) or ""):gmatch("([^ \t\n#]+)[ \t]+(%d+)[ \t]+(%d+)") do
    t[team] = {day = tonumber(d), month = tonumber(m)}
  end
  return t
end

core.register_fetches("vf_account", function(txn)
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
  u.prompt = u.prompt + (tonumber(txn:get_var("txn.vf_prompt")) or 0)
  u.completion = u.completion + (tonumber(txn:get_var("txn.vf_completion")) or 0)
  u.reasoning = u.reasoning + (tonumber(txn:get_var("txn.vf_reasoning")) or 0)
  if txn:get_var("txn.vf_stream") and not txn:get_var("txn.vf_end") then u.cut = u.cut + 1 end
  record(team, (tonumber(txn:get_var("txn.vf_prompt")) or 0) + (tonumber(txn:get_var("txn.vf_completion")) or 0))
  return team
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

-- Each team's budgets (BUDGETS_MAP) and its use in the current UTC day and month (the files' figures).
local function budget_metrics(out)
  local b, limits = sync(), budgets()
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
    local day = b.today[t] or 0
    out[#out + 1] = string.format('voltafleet_team_budget_used_tokens{team="%s",period="day"} %d', t, day)
    out[#out + 1] = string.format('voltafleet_team_budget_used_tokens{team="%s",period="month"} %d', t, (b.base[t] or 0) + day)
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
  local body = table.concat(out, "\n") .. "\n"
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", tostring(string.len(body)))
  applet:start_response()
  applet:send(body)
end)
