"""Credentials left out of everything draftboard shows, stores or hands on: the one place that
knows what a secret looks like.

Every output path goes through here: job params and errors as stored, a job's log header, error
messages (the CLI's `error:` line, the dashboard's alerts), `draftboard ui`'s banner, a Ray job's
runtime_env, the sidebar, Run detail's params. Two shapes are recognised:
- by key: a name that looks like it holds a secret (`wandb_key`, `hf_token`, `MLFLOW_TRACKING_PASSWORD`)
  loses its whole value (`is_secret_key`, `mask_params`);
- by value, wherever it appears in a text: the user and password of a URL (`scheme://user:pw@host`
  -> `scheme://host`), and `key=value` pairs whose key looks secret (`password=hunter2`,
  `?token=abc`) -> `password=***` (`text`).
Imports nothing heavy: the worker, the CLI and the launchers all use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

MASK = "•••• (masked)"
HIDDEN = "***"  # a secret's value inside a longer text

_SECRET_WORDS = {"password", "passwd", "secret", "secrets", "credential", "credentials", "apikey", "passphrase"}
_SECRET_LAST = {"token", "key", "pwd", "pass", "auth", "authorization", "cookie"}
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "token")}

# scheme://userinfo@ : SQLAlchemy and MLflow read `postgresql://admin:pa/ss@db/x` as the password `pa/ss`, where
# urllib sees a host `admin` and a path, and SQLAlchemy takes a quote or a space in a password as written; so a text
# is hidden as the most permissive reader would take it apart. The userinfo runs from `://` to the last '@' of the
# same word (a raw '@' in the password, of any length), else, where the word holds none (a space, a quote, `<` in the
# password), to the next '@' on the line, within MAX_SPACED_USERINFO characters and before the next URL: it hides
# more text rather than less. One pass per line from its end, so any text takes linear time.
_SCHEME = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]{0,31}://")
MAX_SPACED_USERINFO = 512
_WORD_END = frozenset('"<>')


def _without_userinfo(line: str) -> str:
    if "@" not in line or "://" not in line:
        return line
    n = len(line)
    last_in_word, next_at = [-1] * n, [-1] * n  # the last '@' of the word from i on; the next '@' on the line
    word_last = following = -1
    for i in range(n - 1, -1, -1):
        ch = line[i]
        if ch.isspace() or ch in _WORD_END:
            word_last = -1
        elif ch == "@":
            word_last = word_last if word_last != -1 else i
            following = i
        last_in_word[i], next_at[i] = word_last, following
    out, pos = [], 0
    for m in _SCHEME.finditer(line):
        start = m.end()
        if m.start() < pos or start >= n:
            continue
        at = last_in_word[start]
        if at == -1:
            at = next_at[start]
            if at == -1 or at - start > MAX_SPACED_USERINFO or _SCHEME.search(line, start, at) is not None:
                continue
        out.append(line[pos:start])
        pos = at + 1
    out.append(line[pos:])
    return "".join(out)


# key=value (a query string, a DSN, a command line); the key is judged by is_secret_key.
_PAIR = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)=(?P<value>[^\s&;,'\"]+)")


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """True for keys that look like they hold a secret (`wandb_key`, `hf_token`, `mlflow_password`).

    A key *ending* in token/key counts, one merely containing the word does not, so recipe keys
    such as `mask_token_id` or `tokenizer_path` stay visible.
    """
    words = _words(key)
    if not words:
        return False
    return (bool(_SECRET_WORDS.intersection(words)) or words[-1] in _SECRET_LAST
            or any(pair in _SECRET_PAIRS for pair in zip(words, words[1:])))


def short_uri(uri: str) -> str:
    """A store URI in a few characters, for a narrow column: `draftboard.db (sqlite)`, `host:5000
    (http)`; the whole of `shown_uri` otherwise."""
    shown = shown_uri(uri)
    try:
        parts = urlsplit(shown)  # taken apart only once the userinfo is gone, however it was written
        port = parts.port
    except ValueError:
        return shown
    if parts.scheme == "sqlite" or (parts.scheme in ("", "file") and parts.path):
        name = parts.path.rstrip("/").rsplit("/", 1)[-1]
        return f"{name} ({parts.scheme or 'file'})" if name else shown
    if parts.hostname:
        host = parts.hostname + (f":{port}" if port is not None else "")
        return f"{host} ({parts.scheme.split('+')[0]})"
    return shown


def shown_uri(uri: str) -> str:
    """A store or queue URI as a page or a printed command may show it: its user and password left
    out (MLflow reads an http store's from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD), by
    the same rule as any text, so a URI that urllib takes apart otherwise than SQLAlchemy (a '/' in
    the password) or cannot take apart at all still shows no userinfo."""
    return text(uri)


def text(value: object) -> str:
    """`value` as text with every URL's user and password and every secret `key=value` hidden."""
    shown = "\n".join(_without_userinfo(line) for line in str(value).split("\n"))
    return _PAIR.sub(lambda m: f"{m.group('key')}={HIDDEN}" if is_secret_key(m.group("key")) else m.group(0), shown)


def holds_secret(key: str, value: str) -> bool:
    """An environment variable that carries a secret: by its name, or inside its value (a URL with a
    user and password, `password=...`), as `DATABASE_URL=postgresql://user:pw@db/x` does."""
    return is_secret_key(key) or text(value) != value


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """An environment to hand a process that needs no credentials: every variable holding one left out."""
    return {k: v for k, v in environ.items() if not holds_secret(k, v)}


def mask_params(params: Mapping[str, object]) -> dict[str, object]:
    """Params as they may be shown or exported: a secret-looking key keeps its key and loses its
    value; every other value is shown with the secrets inside it hidden (`text`)."""
    return {key: (MASK if is_secret_key(key) else text(value)) if value not in ("", None) else value
            for key, value in params.items()}
