"""Every setting of the server, in one place: CLI flags and ``ELMO_CACHE_*`` environment variables.

Flags win over environment variables, which win over the defaults below
(``elmo-cache serve`` passes only the flags a user actually gave).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from elmo_cache.errors import InvalidParameterError
from elmo_cache.store.journal import DEFAULT_COMMIT_MS, DEFAULT_MAX_BYTES

__all__ = ["Settings", "load_settings", "NOTHING_TO_SERVE"]


class Settings(BaseSettings):
    """Configuration of one ``elmo-cache serve`` process."""

    model_config = SettingsConfigDict(env_prefix="ELMO_CACHE_", extra="forbid", frozen=True)

    # Store to answer from (zarr directory or HDF5 file); None: encode everything live.
    cache_path: Path | None = Field(None, description="cache to answer from (zarr directory or .h5 file)")
    # A model name known to Encoder.load ("bundled", "original", ...) or a directory holding options + weights;
    # None: with a cache, the model recorded in it when that model is available locally.
    model: str | None = Field(None, description="model name or directory for live encodings")
    # The two files of a model in the original layout (alternative to `model`).
    options_file: Path | None = Field(None, description="options.json of the model (with weight_file)")
    weight_file: Path | None = Field(None, description="weight file of the model (with options_file)")
    # Torch device for the encoder ("cpu", "cuda", "cuda:1"); None picks CUDA when available.
    device: str | None = Field(None, description="torch device of the encoder")
    # Compute precision of the encoder; None: the one that built the cache, else fp32.
    precision: str | None = Field(
        None, description="encoder precision (fp32, bf16, fp16); default: the cache's, else fp32"
    )
    host: str = Field("127.0.0.1", description="interface to listen on")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on")
    # When set, every route but /health (and OPTIONS, which answers only Allow/CORS headers) needs
    # `Authorization: Bearer <key>`; /docs, /redoc and /openapi.json too unless open_docs.
    api_key: SecretStr | None = Field(None, description="require this bearer token")
    # Longer sentences are refused (413): they cost memory in both the encoder and the response.
    max_tokens_per_sentence: int = Field(400, ge=1, description="most tokens in one sentence")
    max_sentences_per_request: int = Field(256, ge=1, description="most sentences in one POST /embed")
    # Checked before the body is parsed, from Content-Length and while reading.
    max_body_bytes: int = Field(1_000_000, ge=1, description="largest request body in bytes")
    # A live batch stops growing at this many tokens (a bigger single request runs in slices of it).
    batch_tokens: int = Field(4096, ge=1, description="token budget of one live encoder batch")
    # How long the first request of a batch waits for company; 0 batches only what is already queued.
    max_wait_ms: float = Field(5.0, ge=0, le=10_000, description="longest wait to fill a live batch (ms)")
    # Requests waiting for the encoder beyond this answer 429 at once instead of queueing forever.
    queue_size: int = Field(64, ge=1, description="live requests allowed to wait for the encoder")
    # A live request waiting longer than this (queued + encoding) answers 503 `live_timeout`; the encoder goes on.
    live_timeout_s: float = Field(
        60.0, ge=0, le=86_400, description="longest wait for a live answer, queue included (s); 0: no limit"
    )
    # Estimated from the answer's shapes and format before anything is read or encoded (413 beyond it):
    # a small request can ask for a very large answer (many long sentences, all layers, JSON text).
    max_response_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="largest response body in bytes, estimated before it is built"
    )
    # Cache reads and response writing run in worker threads; a request whose read or write takes
    # longer answers 503 `cache_timeout` (a stuck disk must not hold the client forever). 0: no limit.
    request_timeout_s: float = Field(
        30.0, ge=0, le=86_400, description="longest cache read + response write of one request (s); 0: no limit"
    )
    # Bounded: stuck reads (a dead network disk) can hold at most this many threads; the event loop,
    # /health and live requests never wait for them.
    read_threads: int = Field(4, ge=1, le=256, description="worker threads for cache reads and response writing")
    # On SIGTERM/SIGINT, requests in flight get this long to finish (new ones are answered 503 meanwhile,
    # elmo_cache.server.shutdown) before the server exits anyway.
    graceful_timeout_s: float = Field(
        10.0, ge=0, le=3_600, description="longest wait for requests in flight on shutdown (s)"
    )
    # torch's intra-op threads for live encodings; None: the CPUs this process may use (affinity,
    # cgroup quota), so a server in a CPU-limited container does not oversubscribe it.
    threads: int | None = Field(None, ge=1, description="CPU threads of the encoder; default: the usable CPUs")
    # POST /v1/embeddings (elmo_cache.server.openai_compat): the pool over a text's tokens, and the mix of the
    # layers it pools ("s0,s1,s2" for ELMo, L + 1 weights for a Transformer); None: the average of the layers the
    # cache stores (a mixed cache's own mix).
    openai_pool: Literal["mean", "max", "first-last"] = Field(
        "mean", description="pool of POST /v1/embeddings over a text's tokens"
    )
    openai_mix: str | None = Field(
        None,
        description="layer weights s0,s1,... (one per layer of the model) that POST /v1/embeddings pools; default: "
        "the stored layers' average",
    )
    # Browsers may call the API from these origins (CORS); empty: no CORS headers, browsers' same-origin rule
    # stands. "*" allows any origin (then credentials are not allowed, as the CORS specification requires).
    cors_origins: list[str] = Field(default_factory=list, description="origins allowed by CORS; empty: CORS off")
    # With an api_key, /docs, /redoc and /openapi.json need it too unless this opens them (the API's
    # description is no secret for a public service, but it lists what a key protects).
    open_docs: bool = Field(False, description="serve /docs, /redoc and /openapi.json without the API key")
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    access_log: bool = Field(True, description="log one line per request")
    # Keep the live encodings of misses in the cache's journal (<cache>.writeback; elmo_cache.server.writeback).
    write_back: bool = Field(False, description="keep live encodings of misses beside the cache (needs its model)")
    # The journal never grows past this; when full, misses are still served but no longer kept.
    write_back_max_bytes: int = Field(
        DEFAULT_MAX_BYTES, ge=4096, description="largest size of the write-back journal in bytes"
    )
    # The writer thread writes and fsyncs queued misses once the oldest is this old: what a kill -9 may lose.
    write_back_commit_ms: float = Field(
        DEFAULT_COMMIT_MS, ge=0, le=60_000, description="longest wait before a kept miss is written and fsynced (ms)"
    )

    @field_validator("openai_mix")
    @classmethod
    def _check_openai_mix(cls, value: str | None) -> str | None:
        if value is not None:
            from elmo_cache.rows.selection import MixSpec

            try:  # numbers here; one per layer of the model is checked once the model is known (create_app)
                MixSpec.from_raw(value, n_layers=len(value.split(",")))
            except InvalidParameterError as exc:
                raise ValueError(str(exc).removeprefix("mix: ")) from None
        return value

    @model_validator(mode="after")
    def _check_sources(self) -> Settings:
        if (self.options_file is None) != (self.weight_file is None):
            raise ValueError("options_file and weight_file go together: give both or neither")
        if self.model is not None and self.options_file is not None:
            raise ValueError("give either model or options_file + weight_file, not both")
        return self

    @property
    def has_model(self) -> bool:
        """Whether a model for live encodings is configured."""
        return self.model is not None or self.options_file is not None

    def check_something_to_serve(self) -> None:
        """Refuse settings naming neither a cache nor a model: checked before anything loads."""
        if self.cache_path is None and not self.has_model:
            raise InvalidParameterError(NOTHING_TO_SERVE)

    def limits(self) -> dict[str, Any]:
        """The limits clients must respect (shown by ``GET /info``)."""
        return {
            "max_tokens_per_sentence": self.max_tokens_per_sentence,
            "max_sentences_per_request": self.max_sentences_per_request,
            "max_body_bytes": self.max_body_bytes,
            "batch_tokens": self.batch_tokens,
            "max_wait_ms": self.max_wait_ms,
            "queue_size": self.queue_size,
            "live_timeout_s": self.live_timeout_s,
            "max_response_bytes": self.max_response_bytes,
            "request_timeout_s": self.request_timeout_s,
        }


NOTHING_TO_SERVE = "nothing to serve: give a CACHE, a model (--model, or --options-file with --weight-file), or both"


def load_settings(**overrides: Any) -> Settings:
    """Build :class:`Settings` from ``overrides`` (flags) over the environment.

    ``None`` values are dropped so that an absent flag leaves the environment's value.
    Problems become :class:`InvalidParameterError` naming the setting and its env variable.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            where = f"{field} (ELMO_CACHE_{field.upper()})" if field else "settings"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message}" if field else message)
        raise InvalidParameterError("invalid server settings: " + "; ".join(problems)) from None
