-- Managed by voltafleet (roles/gateway): usage per team at the gateway, for Prometheus.
-- vf_usage, a filter on the frontend, reads every answer's body as it passes, chunk by chunk,
-- for llama-server's own token figures; vf_account runs once a request, when HAProxy logs it
-- (the frontend's log-format calls it), so a stream is counted with its whole duration and
-- whatever it had sent when it ended; vf_team_metrics serves the counters and the stick
-- table's live figures at /metrics/teams. One Lua state (lua-load): the counters are exact
-- across threads; a reload starts them at zero (a counter reset to Prometheus).
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

function Usage:start_analyze(txn, chn)
  if chn:is_resp() then filter.register_data_filter(self, chn) end
end

-- Only JSON answers and event streams are read; any other answer passes untouched.
function Usage:http_headers(txn, msg)
  if not msg.channel:is_resp() then return end
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
          .. "(usage.prompt_tokens; native /completion: tokens_evaluated; a chat stream without include_usage: "
          .. "timings.cache_n + timings.prompt_n), cached ones included; a cut stream counts it only when an "
          .. "event it sent carried it (native /completion)")
  counter(out, teams, "voltafleet_team_completion_tokens_total", "completion",
          "Completion tokens of a team's answers, streamed or not, of any size, as llama-server reports them "
          .. "in the answer (usage.completion_tokens; native /completion: tokens_predicted; a chat stream "
          .. "without include_usage: timings.predicted_n), reasoning included; a stream cut before its last "
          .. "event: the tokens its forwarded events carried (native /completion: the last tokens_predicted; "
          .. "OpenAI streams: one a text event)")
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
  local body = table.concat(out, "\n") .. "\n"
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", tostring(string.len(body)))
  applet:start_response()
  applet:send(body)
end)
