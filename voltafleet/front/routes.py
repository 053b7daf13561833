"""Which of llama-server's routes the gateway lets through, and how each is counted (issue 48).

The gateway is closed by route: a request reaches a server only when its method and path are a
TEAM route below, spelled exactly (no percent-escape, no trailing slash, no doubled slash: a path
llama-server would decode or match another way is not on the list, so it is refused too). Every
other request gets an OpenAI-shaped 404 from the gateway itself, before any server. OPERATOR
routes are reached on a server's own loopback port on its host (the smoke test, Prometheus on the
host), never through the gateway; NOBODY routes are not used at all (the flags keep some off).

A new pin's llama-server may add a route: `unclassified(source_routes(text))` names it, and a test
fails until it is put in ROUTES (tests/gateway_local/test_routes.py reads the pinned source).

    >>> ROUTES[("POST", "/v1/messages")].who
    'team'
    >>> allowed()[:2]
    ['GET:/health', 'GET:/v1/health']
"""
from __future__ import annotations

import re
from dataclasses import dataclass

TEAM, OPERATOR, NOBODY = "team", "operator", "nobody"


@dataclass(frozen=True)
class Route:
    who: str       # TEAM (through the gateway with a team's key), OPERATOR (the server's own port), NOBODY
    counted: str   # how the gateway counts a TEAM route's answer (a request always; tokens as said here)
    why: str = ""  # for a route that no team reaches: why not


def _r(who: str, counted: str = "", why: str = "") -> Route:
    return Route(who, counted, why)


OPENAI_USAGE = ("usage.prompt_tokens and usage.completion_tokens (cached prompt tokens included); a stream: "
                "each event's timings (cache_n + prompt_n, predicted_n: the gateway adds timings_per_token), "
                "cut: the last forwarded event's")
NATIVE = ("tokens_evaluated and tokens_predicted (the gateway empties response_fields); a stream: each event "
          "carries them, cut: the last forwarded event's")
ANTHROPIC = ("usage.input_tokens + usage.cache_read_input_tokens (the server reports the cached part apart) "
             "and output_tokens; a stream: message_start's input figures, message_delta's output_tokens, "
             "cut before message_delta: the content_block_delta events forwarded")
REQUEST_ONLY = "a request (no tokens: nothing is evaluated)"

INTERNAL = "internal: the server's state, model path, build or template; not the fleet's API"

# Every route of llama-server at the pinned commit (tools/server/server.cpp, server-http.cpp), by (method, path).
ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/health"): _r(TEAM, REQUEST_ONLY),
    ("GET", "/v1/health"): _r(TEAM, REQUEST_ONLY),
    ("GET", "/models"): _r(TEAM, REQUEST_ONLY),
    ("GET", "/v1/models"): _r(TEAM, REQUEST_ONLY),
    ("POST", "/v1/chat/completions"): _r(TEAM, OPENAI_USAGE),
    ("POST", "/chat/completions"): _r(TEAM, OPENAI_USAGE),
    ("POST", "/v1/completions"): _r(TEAM, OPENAI_USAGE),
    ("POST", "/completion"): _r(TEAM, NATIVE),
    ("POST", "/completions"): _r(TEAM, NATIVE),
    ("POST", "/v1/messages"): _r(TEAM, ANTHROPIC),
    ("GET", "/metrics"): _r(OPERATOR, why="the server's own counters: scraped on its host (the smoke test reads them)"),
    ("GET", "/props"): _r(NOBODY, why=INTERNAL + " (the model file's path on the host)"),
    ("POST", "/props"): _r(NOBODY, why="changes a serving instance's global properties (the flags keep it off)"),
    ("GET", "/slots"): _r(NOBODY, why="shows users' prompts (--no-slots)"),
    ("POST", "/slots/:id_slot"): _r(NOBODY, why="saves and restores slots on the host's disk"),
    ("POST", "/tokenize"): _r(NOBODY, why=INTERNAL),
    ("POST", "/detokenize"): _r(NOBODY, why=INTERNAL),
    ("POST", "/apply-template"): _r(NOBODY, why=INTERNAL + " (the chat template)"),
    ("GET", "/lora-adapters"): _r(NOBODY, why=INTERNAL),
    ("POST", "/lora-adapters"): _r(NOBODY, why="changes a serving instance's adapters"),
    ("GET", "/v1/stream"): _r(NOBODY, why="replays a conversation's stream: its tokens would be counted twice"),
    ("DELETE", "/v1/stream"): _r(NOBODY, why="a conversation's stream session (the gateway removes X-Conversation-Id)"),
    ("POST", "/v1/streams/lookup"): _r(NOBODY, why="other conversations' stream sessions"),
    ("POST", "/infill"): _r(NOBODY, why="code infill: the fleet's model is a chat model, not served"),
    ("POST", "/embedding"): _r(NOBODY, why="embeddings are not served (no --embeddings)"),
    ("POST", "/embeddings"): _r(NOBODY, why="embeddings are not served (no --embeddings)"),
    ("POST", "/v1/embeddings"): _r(NOBODY, why="embeddings are not served (no --embeddings)"),
    ("POST", "/rerank"): _r(NOBODY, why="reranking is not served (no --reranking)"),
    ("POST", "/reranking"): _r(NOBODY, why="reranking is not served (no --reranking)"),
    ("POST", "/v1/rerank"): _r(NOBODY, why="reranking is not served (no --reranking)"),
    ("POST", "/v1/reranking"): _r(NOBODY, why="reranking is not served (no --reranking)"),
    ("POST", "/v1/responses"): _r(NOBODY, why="the Responses API: its usage is not counted by the gateway yet"),
    ("POST", "/responses"): _r(NOBODY, why="the Responses API: its usage is not counted by the gateway yet"),
    ("POST", "/v1/chat/completions/control"): _r(NOBODY, why="controls another request's generation"),
    ("POST", "/v1/audio/transcriptions"): _r(NOBODY, why="audio is not served (text model)"),
    ("POST", "/audio/transcriptions"): _r(NOBODY, why="audio is not served (text model)"),
    ("POST", "/chat/completions/input_tokens"): _r(NOBODY, why=INTERNAL + " (token counting)"),
    ("POST", "/v1/chat/completions/input_tokens"): _r(NOBODY, why=INTERNAL + " (token counting)"),
    ("POST", "/responses/input_tokens"): _r(NOBODY, why=INTERNAL + " (token counting)"),
    ("POST", "/v1/responses/input_tokens"): _r(NOBODY, why=INTERNAL + " (token counting)"),
    ("POST", "/v1/messages/count_tokens"): _r(NOBODY, why=INTERNAL + " (token counting)"),
    ("GET", "/cors-proxy"): _r(NOBODY, why="the web UI's proxy to other hosts (SSRF)"),
    ("POST", "/cors-proxy"): _r(NOBODY, why="the web UI's proxy to other hosts (SSRF)"),
    ("GET", "/tools"): _r(NOBODY, why="server-side tools (off)"),
    ("POST", "/tools"): _r(NOBODY, why="server-side tools (off)"),
    ("POST", "/models"): _r(NOBODY, why="router mode only: loads models"),
    ("POST", "/models/load"): _r(NOBODY, why="router mode only: loads models"),
    ("POST", "/models/unload"): _r(NOBODY, why="router mode only: unloads models"),
    ("GET", "/models/sse"): _r(NOBODY, why="router mode only"),
    ("DELETE", "/models"): _r(NOBODY, why="router mode only: deletes models"),
    ("POST", "/predict"): _r(NOBODY, why="Vertex AI compatibility (AIP_MODE): any route by another name"),
    ("GET", "/"): _r(NOBODY, why="the web UI (--no-webui)"),
    ("GET", "/index.html"): _r(NOBODY, why="the web UI (--no-webui)"),
    ("GET", "/sw.js"): _r(NOBODY, why="the web UI (--no-webui)"),
}



def _method(name: str) -> str:
    """An HTTP method from a registration's name: ctx_http.del, srv->Get and the like."""
    return "DELETE" if name.lower() == "del" else name.upper()


_CTX = re.compile(r'ctx_http\.(get|post|del|put|patch)\s*\(\s*"([^"]+)"')
_SRV = re.compile(r'srv->(Get|Post|Delete|Put|Patch)\s*\(\s*params\.api_prefix\s*\+\s*"([^"]+)"\s*,')
_GCP = re.compile(r'getenv\("AIP_PREDICT_ROUTE",\s*"([^"]+)"')


def source_routes(*texts: str) -> set[tuple[str, str]]:
    """Every (method, path) a llama-server source registers: `ctx_http.get("/path", ...)` and the like
    (server.cpp), the web UI's `srv->Get(params.api_prefix + "/path", ...)` and Vertex AI's predict route
    (server-http.cpp)."""
    out: set[tuple[str, str]] = set()
    for text in texts:
        out |= {(_method(m), p) for m, p in _CTX.findall(text) + _SRV.findall(text)}
        out |= {("POST", p) for p in _GCP.findall(text)}
    return out


def unclassified(found: set[tuple[str, str]]) -> list[str]:
    """The routes of a source that ROUTES does not classify, as `METHOD /path`, sorted."""
    return sorted(f"{m} {p}" for m, p in found - set(ROUTES))


def allowed() -> list[str]:
    """The gateway's allow-list: `METHOD:/path` of every TEAM route, as HAProxy matches it."""
    return sorted(f"{m}:{p}" for (m, p), r in ROUTES.items() if r.who == TEAM)


NOT_FOUND = ("Unknown route: this gateway serves the fleet API only (/v1/chat/completions, /v1/completions, "
             "/v1/messages, /v1/models)")
GATEWAY_ERROR = ("The gateway could not check or count this request, so it was not served: retry later "
                 "(the operator is alerted)")
# the gateway's own stages that can fail (voltafleet_gateway_errors_total{stage}); each refuses with GATEWAY_ERROR
ERROR_STAGES = ("limits", "budget", "budget_files", "budget_loading", "rewrite", "count", "record", "account")


def table_markdown() -> str:
    """docs/gateway.md's route table, from ROUTES (a unit test keeps the page equal to it)."""
    rows = ["| route | who | counted as / why not |", "|---|---|---|"]
    order = {TEAM: 0, OPERATOR: 1, NOBODY: 2}
    for (m, p), r in sorted(ROUTES.items(), key=lambda kv: (order[kv[1].who], kv[0][1], kv[0][0])):
        who = {TEAM: "a team (its key)", OPERATOR: "the operator, on the host", NOBODY: "nobody"}[r.who]
        rows.append(f"| `{m} {p}` | {who} | {r.counted or r.why} |")
    return "\n".join(rows)
