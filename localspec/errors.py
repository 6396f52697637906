"""Errors a user can act on. The CLI prints each as one line (no traceback) and exits with its code."""

from __future__ import annotations

import os



def debug_enabled() -> bool:
    """LOCALSPEC_DEBUG=1: tracebacks and third-party logs (llama.cpp's, huggingface_hub's) on stderr."""
    return bool(os.environ.get("LOCALSPEC_DEBUG"))

class LocalspecError(Exception):
    """Base class: the message is one line that names the fix."""

    exit_code = 1


class UsageError(LocalspecError):
    """Bad arguments or input files (exit 2)."""

    exit_code = 2


class ProfileError(UsageError):
    """A profile file is missing, malformed, or breaks the schema."""


class UnsafePathError(UsageError):
    """A name from a profile or the command line would escape LOCALSPEC_HOME."""


class StoreError(LocalspecError):
    """A model could not be fetched or verified."""


class ChecksumError(StoreError):
    """Downloaded or cached bytes do not match the expected sha256."""


class GGUFError(LocalspecError):
    """A file is not a well-formed GGUF (exit 2)."""

    exit_code = 2


class GrammarError(UsageError):
    """A grammar or JSON schema that constrained decoding cannot build."""


class TemplateError(LocalspecError):
    """A chat template failed to render in the sandbox."""


class IncompatibleError(LocalspecError):
    """Target and draft cannot be paired; the message is the checker's first reason."""


class ContextFullError(LocalspecError):
    """The prompt or conversation does not fit in the model's context window."""


class PromptTooLong(ContextFullError):
    """The prompt leaves no room to answer in the context window; each front end names its own fix."""

    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        super().__init__(f"the prompt is {n_prompt} tokens but the context window is {n_ctx}")
