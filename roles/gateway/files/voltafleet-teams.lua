-- Managed by voltafleet (roles/gateway): usage per team at the gateway, for Prometheus.
-- vf_account runs once a request, when HAProxy logs it (the frontend's log-format calls it),
-- so a stream is counted with its whole duration; vf_team_metrics serves the counters and the
-- stick table's live figures at /metrics/teams. One Lua state (lua-load): the counters are
-- exact across threads; a reload starts them at zero (a counter reset to Prometheus).
local usage = {}
local TABLE = "vf_teams"

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec // 1000
end

core.register_fetches("vf_account", function(txn)
  local team = txn:get_var("txn.team") or "-"
  local u = usage[team]
  if u == nil then
    u = {requests = 0, codes = {}, ms = 0, tokens = 0}
    usage[team] = u
  end
  local code = tostring(txn:get_var("txn.status") or 0)
  u.requests = u.requests + 1
  u.codes[code] = (u.codes[code] or 0) + 1
  local t0 = tonumber(txn:get_var("txn.t0"))
  if t0 then u.ms = u.ms + math.max(0, now_ms() - t0) end
  u.tokens = u.tokens + (tonumber(txn:get_var("txn.ctok")) or 0)
  return team
end)

local function metric(out, name, help, kind)
  out[#out + 1] = "# HELP " .. name .. " " .. help
  out[#out + 1] = "# TYPE " .. name .. " " .. kind
end

core.register_service("vf_team_metrics", "http", function(applet)
  local out = {}
  local teams = {}
  for team in pairs(usage) do teams[#teams + 1] = team end
  table.sort(teams)
  metric(out, "voltafleet_team_requests_total", "Requests a team sent through the gateway (team - : no known key)", "counter")
  for _, t in ipairs(teams) do
    out[#out + 1] = string.format('voltafleet_team_requests_total{team="%s"} %d', t, usage[t].requests)
  end
  metric(out, "voltafleet_team_responses_total", "Answers to a team by HTTP status (401, 429, 503 from the gateway itself)", "counter")
  for _, t in ipairs(teams) do
    local codes = {}
    for c in pairs(usage[t].codes) do codes[#codes + 1] = c end
    table.sort(codes)
    for _, c in ipairs(codes) do
      out[#out + 1] = string.format('voltafleet_team_responses_total{team="%s",code="%s"} %d', t, c, usage[t].codes[c])
    end
  end
  metric(out, "voltafleet_team_request_seconds_total", "Seconds a team's requests took, each from arrival to its last byte", "counter")
  for _, t in ipairs(teams) do
    out[#out + 1] = string.format('voltafleet_team_request_seconds_total{team="%s"} %.3f', t, usage[t].ms / 1000)
  end
  metric(out, "voltafleet_team_completion_tokens_total", "Completion tokens of a team's non-streamed answers (usage block)", "counter")
  for _, t in ipairs(teams) do
    out[#out + 1] = string.format('voltafleet_team_completion_tokens_total{team="%s"} %d', t, usage[t].tokens)
  end
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
