"""Error types: one per kind of failure, all under OvbuildError, each message naming the file, key or tensor."""


class OvbuildError(Exception):
    """Base of every error ovbuild raises on purpose."""


class ConfigError(OvbuildError):
    """A config.json (or option) is missing a key, holds a bad value or contradicts itself."""


class CheckpointError(OvbuildError):
    """A checkpoint folder or file cannot be used: missing, truncated, pickled, inconsistent index."""


class TensorError(OvbuildError):
    """A tensor is missing from the checkpoint or has the wrong shape or dtype."""


class UnsupportedError(OvbuildError):
    """The input is well formed but asks for something ovbuild does not do (architecture, head type, option)."""


class CompatibilityError(OvbuildError):
    """A draft does not fit the target it is paired with (taps, hidden size, vocabulary)."""


class ExportError(OvbuildError):
    """An exported folder cannot be written or read back."""


class CacheExhaustedError(OvbuildError):
    """The paged KV cache has no free block left for a request that cannot wait."""


class RequestError(OvbuildError):
    """A generation request cannot be served as given (prompt not UTF-8, token ids outside the vocabulary, too long,
    a bad parameter, messages the chat template refuses); `param` names the offending field when there is one."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class GrammarError(RequestError):
    """A structured-output constraint cannot be compiled: an invalid JSON schema or one using a feature the grammar
    engine lacks, a bad regex, an unparsable grammar, or a compile that ran past its time bound."""


class OverloadedError(OvbuildError):
    """The server already holds as many requests as it may queue; the client should retry later."""


class MissingDependencyError(OvbuildError):
    """An optional dependency (an extra such as ovbuild[serve]) is not installed."""


class ImageError(OvbuildError):
    """An image cannot be used: empty, corrupt or truncated, a format ovbuild does not decode, or too large for the
    stated limits; the message names the source and what is wrong."""
