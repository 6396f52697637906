"""One generation at a time: a worker thread runs requests from a bounded FIFO queue.

llama.cpp calls block and the engine is not thread-safe, so every model call happens on this one
thread; a CPU gives the best tokens/s to one generation anyway. The event loop hands a ``Job`` in and
gets its pieces back through the job's thread-safe ``emit``. A cancelled job (client gone, server
stopping) is noticed between pieces, so its generation stops within a round, and closing the stream
runs the decoder's ``finally``, which leaves both KV caches consistent for the next request.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace

from localspec.conversation import TEMPLATE_KEY, Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import InfillRule, SamplingParams
from localspec.engine.decoding.stats import GenerationStats
from localspec.engine.llama.model import Model
from localspec.engine.llama.rpc import RpcServerError, check_servers
from localspec.errors import ContextFullError, GrammarError, LocalspecError, PromptTooLong, TemplateError, UsageError
from localspec.fim import CompletionLimits, fim_prompt
from localspec.gguf.memory import MemoryKind
from localspec.prompt_cache import PromptCache, Restored
from localspec.server.reasoning import THINK_OPEN, ReasoningDelta, ReasoningSplitter, has_reasoning
from localspec.server.request import APIError, GenerationRequest
from localspec.server.results import cached_tokens
from localspec.session import close_decoder
from localspec.tool_calls import (
    GENERIC,
    HERMES_CLOSE,
    HERMES_OPEN,
    MISTRAL_OPEN,
    CallDelta,
    TextDelta,
    ToolCallParser,
    call_grammar,
    detect_syntax,
    generic_tool_messages,
)

DEFAULT_MAX_QUEUE = 8

log = logging.getLogger("localspec.server")


@dataclass(frozen=True)
class Finished:
    stats: GenerationStats
    method: str  # the configured speculation method (per-round methods are in stats)
    called: bool = False  # the answer called tools (OpenAI's finish_reason "tool_calls")
    stop: str | None = None  # the stop string that ended the answer, if one did
    # Where an editor's limit ended the answer (fim.CompletionLimits): the characters of its text kept. The
    # n_indent rule cuts a line already sent, as llama-server's does.
    kept: int | None = None


@dataclass(frozen=True)
class Failed:
    error: APIError


@dataclass(frozen=True)
class Prefilling:
    """The request passed every check and its prompt is being evaluated (sent again after each chunk):
    a stream may begin, and a client waiting through a long prefill hears the server is alive."""

    done: int
    total: int


Event = TextDelta | CallDelta | ReasoningDelta | Prefilling | Finished | Failed


class _Cancelled(Exception):
    """Raised from the prefill progress callback to abandon a long prompt whose client has gone."""


class Job:
    """One request on its way through the worker. ``emit`` must be thread-safe: the worker thread calls it,
    and so does ``GenerationWorker.shut_down`` on whichever thread stops the server."""

    def __init__(self, request: GenerationRequest, emit: Callable[[Event], None]) -> None:
        self.request = request
        self.emit = emit
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry when it is running again",
                    type="server_error", code="shutting_down")


def _turn_away(job: Job) -> None:
    job.cancel()
    job.emit(Failed(_shutting_down()))


class GenerationWorker:
    """Owns the decoder; runs queued jobs one by one on its own thread.

    Args:
        decoder: the engine; only this worker's thread touches it once started.
        sampling: the server's defaults, which a request's own fields override.
        max_tokens: the answer limit for requests that set none (None: until the context is full).
        max_queue: jobs that may wait behind the running one; more are refused (HTTP 429).
        prompt_cache: states of earlier prompts to restore before a prefill (None: only the one KV cache).
        reopen: loads the pair anew, after an RPC server the target is spread over was lost (None: no RPC).
    """

    def __init__(
        self, decoder: SpeculativeDecoder, sampling: SamplingParams, *, max_tokens: int | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE, prompt_cache: PromptCache | None = None,
        reopen: Callable[[], SpeculativeDecoder] | None = None,
    ) -> None:
        self.decoder = decoder
        self.reopen = reopen
        # The RPC server lost mid-answer, until the pair is loaded again (/health names it).
        self.missing_server: str | None = None
        self.prompt_cache = prompt_cache
        self.sampling = sampling
        self.max_tokens = max_tokens
        template = decoder.target.metadata.get(TEMPLATE_KEY)
        self.has_chat_template = bool(template)
        self.thinks = bool(template) and has_reasoning(template)
        self.tool_syntax = detect_syntax(template) if template else GENERIC
        if template and self.tool_syntax.generic:
            log.warning("the chat template of %s defines no tool-call syntax: tools are described in a system "
                        "message and calls read as <tool_call> JSON (generic format)", decoder.target.path.name)
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._current: Job | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="localspec-generation", daemon=True)

    @property
    def busy(self) -> bool:
        return self._current is not None

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def start(self) -> None:
        self._thread.start()

    def shut_down(self) -> None:
        """Refuse new jobs and answer the running and waiting ones with a 503 now, so their responses end."""
        self._closing = True
        jobs = [self._current]
        while True:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                break
        for job in jobs:
            if job is not None:
                _turn_away(job)

    def stop(self, timeout: float = 30.0) -> None:
        """End the thread once the current round is over (after ``shut_down``, nothing is left to run)."""
        self.shut_down()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        if self._closing:
            raise _shutting_down()
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise APIError(
                429, f"the server is busy: its queue of {self._jobs.maxsize} waiting requests is full; retry shortly",
                type="rate_limit_error", code="queue_full",
            ) from None

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The prompt the model is given for ``request`` (for scripts/bench/agents.py's shared-prefix figures)."""
        return self._prompt(request)[0]

    def _restore(self, prompt: list[int]) -> Restored | None:
        """Restore the cached states that skip the most of the prompt, the draft's too (it then catches up
        from there, not from the start)."""
        if self.prompt_cache is None:
            return None
        draft = self.decoder.draft
        if draft is not None and draft.loaded:
            self.prompt_cache.restore(draft.model, prompt)
        return self.prompt_cache.restore(self.decoder.target, prompt)

    def _keep_all(self) -> None:
        """Cache the states the models hold after a job (a cancelled one's too: its prefill so far)."""
        draft = self.decoder.draft
        self._keep(self.decoder.target)
        if draft is not None and draft.loaded:
            self._keep(draft.model)

    def _keep(self, model: Model) -> None:
        if self.prompt_cache is None:
            return
        try:
            self.prompt_cache.keep(model)
        except LocalspecError as exc:  # a state not kept costs a later prefill, never an answer
            log.warning("prompt cache: %s", exc)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._closing:  # taken off the queue just as shut_down emptied it
                _turn_away(job)
            if job.cancelled:
                continue
            self._current = job
            try:
                self._reload_if_lost()
                self._generate(job)
            except _Cancelled:
                pass
            except RpcServerError as exc:
                self.missing_server = exc.server
                job.emit(Failed(APIError(503, str(exc), type="server_error", code="rpc_server_lost")))
            except APIError as exc:
                job.emit(Failed(exc))
            except GrammarError as exc:
                job.emit(Failed(APIError(400, str(exc), code="invalid_schema")))
            except PromptTooLong as exc:
                job.emit(Failed(APIError(
                    400, f"the prompt is {exc.n_prompt} tokens but the context window is {exc.n_ctx} tokens; "
                         "send a shorter prompt or restart the server with a larger --ctx",
                    code="context_length_exceeded")))
            except (UsageError, ContextFullError, TemplateError) as exc:
                job.emit(Failed(APIError(400, str(exc))))
            except LocalspecError as exc:
                job.emit(Failed(APIError(500, str(exc), type="server_error")))
            except Exception as exc:  # a bug must cost one request, not the server
                log.exception("generation failed")
                job.emit(Failed(APIError(500, f"internal error ({type(exc).__name__}); see the server log",
                                         type="server_error")))
            finally:
                if self.missing_server is None:  # a lost server's model holds nothing worth keeping
                    self._keep_all()  # after the answer is out
                self._current = None

    def _reload_if_lost(self) -> None:
        """After a lost RPC server: once it answers again, free the broken pair and load it anew."""
        if self.missing_server is None:
            return
        target = self.decoder.target
        assert target.rpc is not None and self.reopen is not None  # only a target over RPC loses a server
        # Raises, naming it, while it is still away (the others are busy with the broken model's connections).
        check_servers([self.missing_server])
        close_decoder(self.decoder)
        self.decoder = self.reopen()
        self.missing_server = None
        log.info("RPC servers %s are back; the pair is loaded again", ", ".join(target.rpc.servers))

    def count_tokens(self, request: GenerationRequest) -> int:
        """The prompt's length in tokens (tokenizing reads the vocabulary only: safe beside a generation)."""
        try:
            return len(self._prompt(request)[0])
        except TemplateError as exc:
            raise APIError(400, str(exc)) from None

    def _prompt(self, request: GenerationRequest) -> tuple[list[int], bool]:
        """The prompt's tokens, and whether it ends inside the model's reasoning (the template opened it)."""
        if request.fim is not None:
            # The server's own answer limit takes a share of the context from the chunks, as llama-server's -n.
            target = self.decoder.target
            return fim_prompt(target, request.fim, n_ctx=target.n_ctx, n_predict=self.max_tokens or -1), False
        if request.messages is None:
            return Conversation(self.decoder, chat=False).render([{"role": "user", "content": request.prompt}]), False
        if not self.has_chat_template:
            raise APIError(400, f"{self.decoder.target.path.name} has no chat template; "
                                "send raw text to /v1/completions instead")
        messages, tools = request.messages, request.offered_tools
        if self.tool_syntax.generic:
            messages = generic_tool_messages(messages, tools)
        conversation = Conversation(self.decoder)
        text, add_bos = conversation.render_text(messages, tools=None if self.tool_syntax.generic else tools,
                                                 thinking=request.thinking)
        return conversation.tokenize(text, add_bos), self.thinks and text.rstrip().endswith(THINK_OPEN)

    def _constraint(self, request: GenerationRequest):
        """The grammar a request's answer must follow, or None."""
        if request.json_schema is None and request.tool_choice not in ("required", "function"):
            return None
        # Imported here: llguidance loads only once a request asks for constrained output.
        from localspec.engine.decoding.constraints import (
            GrammarConstraint,
            compact_json,
            json_schema_grammar,
            special_token_forms,
        )

        model = self.decoder.target
        if request.json_schema is not None:
            grammar = json_schema_grammar(request.json_schema)
        else:
            tools = [t for t in request.tools if request.tool_choice == "required"
                     or t["function"]["name"] == request.tool_name]
            special = special_token_forms(model, (HERMES_OPEN, HERMES_CLOSE, MISTRAL_OPEN))
            # An agent's tools cannot be refused for a rare schema keyword; a response format can (it says why).
            grammar = call_grammar(self.tool_syntax, tools, special=special,
                                   json_text=functools.partial(compact_json, lenient=True),
                                   parallel=request.parallel_tool_calls and request.tool_choice == "required")
        return GrammarConstraint(model, grammar)

    def _generate(self, job: Job) -> None:
        request, decoder = job.request, self.decoder
        prompt, reasoning_opened = self._prompt(request)
        restored = self._restore(prompt)
        # Without a limit, generate until the end of the answer or of the context window.
        max_tokens = request.max_tokens or self.max_tokens or decoder.target.n_ctx - len(prompt)
        sampling = replace(self.sampling, **request.sampling_overrides())
        if request.infill_sampler and not sampling.greedy:
            sampling = replace(sampling, infill=InfillRule(decoder.target))

        def abandon_if_cancelled(done: int, total: int) -> None:
            # Called between prefill chunks; the KV cache holds exactly the chunks evaluated so far.
            if job.cancelled:
                raise _Cancelled
            job.emit(Prefilling(done, total))
            if done == total and decoder.target.memory_plan.memory != MemoryKind.KV:
                # A recurrent state is restored only where it was saved, and the next turn re-renders this
                # answer (perhaps not token for token): the whole prompt is the prefix it surely starts with.
                self._keep(decoder.target)

        # stream() refuses a prompt that cannot fit at once, before the answer's stream starts.
        text = decoder.stream(prompt, stop=request.stop, max_tokens=max_tokens, sampling=sampling,
                              prefill_progress=abandon_if_cancelled, constraint=self._constraint(request))
        job.emit(Prefilling(0, len(prompt)))
        tools = request.offered_tools
        parser = ToolCallParser(self.tool_syntax, tools) if tools else None
        splitter = ReasoningSplitter(opened=reasoning_opened) if self.thinks and request.messages else None

        def emit(deltas) -> None:
            for delta in deltas:
                if not isinstance(delta, CallDelta) or delta.index == 0 or request.parallel_tool_calls:
                    job.emit(delta)  # a call past the first is answered only with parallel_tool_calls

        def answer(pieces) -> None:
            """The answer's text, split into reasoning, text and tool calls."""
            for piece in pieces:
                if isinstance(piece, ReasoningDelta):
                    emit([piece])
                else:
                    emit(parser.feed(piece) if parser else [TextDelta(piece)])

        limits = (CompletionLimits(n_indent=request.n_indent, t_max_predict_ms=request.t_max_predict_ms)
                  if request.n_indent or request.t_max_predict_ms else None)
        stop = None
        with closing(text) as pieces:
            for piece in pieces:
                if job.cancelled:
                    return
                stop = piece.stop
                if piece.text:
                    answer(splitter.feed(piece.text) if splitter else [piece.text])
                    if limits is not None and limits.feed(piece.text):
                        break
        if splitter:
            answer(splitter.finish())
        if parser:
            emit(parser.finish())
        stats = decoder.stats
        kept = len(limits.text) if limits is not None and limits.ended else None
        job.emit(Finished(stats, decoder.controller.method, called=bool(parser and parser.calls), stop=stop,
                          kept=kept))
        cached = (f", {restored.tokens} restored from the prompt cache's {restored.source} in {restored.seconds:.2f} s"
                  if restored else "")
        log.info("%s | %d prompt tokens (%d reused%s) | %s", request.api, stats.prompt_tokens,
                 cached_tokens(stats), cached, stats.summary_line())
