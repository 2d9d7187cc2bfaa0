"""The tokenizer a GGUF file carries (``tokenizer.ggml.*``), as llama.cpp applies it.

Two models, as the file's ``tokenizer.ggml.model`` names them:

- ``gpt2``: byte-level BPE with the file's merges. The pre-tokenizer (which pieces of text
  BPE may merge within) is the list of regular expressions llama.cpp uses for the
  ``tokenizer.ggml.pre`` the file names (:data:`PRE`); each piece's bytes are spelt in
  GPT-2's byte-to-character map and merged, lowest rank first. Both steps are the
  ``tokenizers`` library's (``Split`` on each expression in turn, ``ByteLevel`` without its
  own expression, a ``BPE`` model made from the file's vocabulary and merges), which does
  them as llama.cpp does, including llama 3's rule that a piece already in the vocabulary is
  taken whole (``ignore_merges``).
- ``llama``: SentencePiece-style, with a score for each piece. This one is written here:
  llama.cpp does not run SentencePiece's own algorithm on it but a merge of adjacent
  symbols by the highest score of the piece they make (ties to the leftmost pair), starting
  from UTF-8 characters, with a byte fallback (``<0xAB>`` tokens) for any symbol left that
  is not a piece; ``tokenizers`` has no model that merges by piece score, and its Unigram
  model finds the best segmentation, which is not what llama.cpp computes. Spaces become
  U+2581 and, where the file says so (the default), the text gets a leading one.

- ``gemma4`` (gemma's 262 144-token vocabulary as llama.cpp's ``ggml-vocab-gemma-4.gguf``
  stores it): BPE over raw UTF-8 rather than GPT-2's byte map, SentencePiece-style: spaces
  become U+2581, the text is split only into runs of newlines and runs of anything else (a run
  of newlines that is a token is taken whole), within each the adjacent symbols merge by the
  lowest rank of the file's merges (ties to the leftmost pair, as llama.cpp's queue orders
  them), starting from UTF-8 characters, and a symbol left that is not a token falls back to
  its bytes (``<0xAB>``). llama.cpp always adds its BOS.

Before any of them, the special tokens are cut out of the text, longest first, as llama.cpp
does: user-defined tokens always, control tokens (``<|im_start|>``, ``</s>``) only when
``parse_special`` (a chat template's text), never when the text is a user's prompt.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

from smallem.generating.gguf_file import GGUFError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

# tokenizer.ggml.pre -> (the expressions, in turn; whether a piece in the vocabulary is taken
# whole; add_bos when the file does not say): llama.cpp's table (src/llama-vocab.cpp)
PRE = {
    "default": (_DEFAULT, False, False),
    "llama-bpe": ((_LLAMA3,), True, True), "llama3": ((_LLAMA3,), True, True),
    "llama-v3": ((_LLAMA3,), True, True),
    "qwen2": ((_QWEN2,), False, False), "deepseek-r1-qwen": ((_QWEN2,), False, False),
    "smollm": ((r"\p{N}", _GPT2), False, False),
    "gpt-2": ((_GPT2,), False, False),
}


def byte_tokens() -> list[str]:
    """GPT-2's map from bytes to printable characters (its BPE never sees a raw control
    byte): the printable Latin-1 bytes stand for themselves, the other 68 take the
    characters from U+0100 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


@dataclass
class _Sym:
    start: int
    n: int
    prev: int
    next: int


class Tokenizer:
    def __init__(self, tok: dict, path="the file"):
        self.path = path
        model = tok.get("model")
        if model not in ("gpt2", "llama", "gemma4"):
            raise GGUFError(f"{path}: tokenizer model {model!r} is not supported "
                            f"(supported: gpt2, llama, gemma4)")
        tokens = tok.get("tokens")
        if not isinstance(tokens, list) or not tokens:
            raise GGUFError(f"{path}: metadata key 'tokenizer.ggml.tokens' is missing")
        self.model, self.tokens = model, tokens
        n = len(tokens)
        types = tok.get("token_type") or [NORMAL] * n
        if len(types) != n:
            raise GGUFError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries "
                            f"for {n} tokens")
        self.types = types
        self.ids = {t: i for i, t in enumerate(tokens)}  # the last of equal texts wins, as there
        specials = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        self._specials = sorted(specials, key=lambda i: -len(tokens[i].encode()))

        def special(key):
            v = tok.get(key)
            if v is None:
                return None
            if not isinstance(v, int) or not 0 <= v < n:
                raise GGUFError(f"{path}: tokenizer.ggml.{key} is {v!r}, not a token id")
            return v

        self.bos, self.eos = special("bos_token_id"), special("eos_token_id")
        self.eot = special("eot_token_id")
        if model == "llama":
            scores = tok.get("scores")
            if not isinstance(scores, list) or len(scores) != n:
                raise GGUFError(f"{path}: a llama tokenizer needs tokenizer.ggml.scores, one "
                                f"per token")
            self.scores = scores
            self.add_bos = bool(tok.get("add_bos_token", True))
            self.add_space_prefix = bool(tok.get("add_space_prefix", True))
        elif model == "gemma4":
            merges = tok.get("merges")
            if not isinstance(merges, list) or not merges:
                raise GGUFError(f"{path}: a gemma4 tokenizer needs tokenizer.ggml.merges")
            self.ranks = {}
            for rank, m in enumerate(merges):
                cut = m.find(" ", 1)  # as llama.cpp splits them: a piece may be a space
                if cut < 0:
                    raise GGUFError(f"{path}: merge {m!r} is not two pieces")
                self.ranks.setdefault((m[:cut], m[cut + 1:]), rank)
            self.add_bos = True   # llama.cpp forces it for this pre-tokenizer
            self.add_space_prefix = False
        else:
            pre = tok.get("pre") or "default"
            if pre not in PRE:
                raise GGUFError(f"{path}: pre-tokenizer {pre!r} is not supported "
                                f"(supported: {', '.join(PRE)})")
            exprs, ignore, bos = PRE[pre]
            self.pre = pre
            self.add_bos = bool(tok.get("add_bos_token", bos))
            self._bpe = _bpe(tokens, tok.get("merges") or [], exprs, ignore, path)
        self.add_eos = bool(tok.get("add_eos_token", False))
        if self.add_bos and self.bos is None:
            raise GGUFError(f"{path}: the tokenizer adds a BOS token but names none")
        self._bytes = None

    # ------------------------------------------------------------------ text to ids
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list:
        out = [self.bos] if add_special and self.add_bos else []
        prev_special = True
        for piece, tid in self._partition(text, parse_special):
            if tid is not None:
                out.append(tid)
                prev_special = True
                continue
            if self.model == "llama":
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                out += self._spm(piece.replace(" ", "\u2581"))
            elif self.model == "gemma4":
                for word in re.findall(r"[^\n]+|\n+", piece.replace(" ", "\u2581")):
                    if word[0] == "\n" and word in self.ids:
                        out.append(self.ids[word])
                    else:
                        out += self._merge(word, self._rank)
            else:
                out += self._bpe.encode(piece, add_special_tokens=False).ids
            prev_special = False
        if add_special and self.add_eos and self.eos is not None:
            out.append(self.eos)
        return out

    def _partition(self, text: str, parse_special: bool):
        """[(text, None) or (token text, id)]: the special tokens cut out, longest first."""
        parts = [(text, None)] if text else []
        for i in self._specials:
            if not parse_special and self.types[i] in (CONTROL, UNKNOWN):
                continue
            s = self.tokens[i]
            if not s:
                continue
            new = []
            for piece, tid in parts:
                if tid is not None or s not in piece:
                    new.append((piece, tid))
                    continue
                chunks = piece.split(s)
                for j, c in enumerate(chunks):
                    if c:
                        new.append((c, None))
                    if j < len(chunks) - 1:
                        new.append((s, i))
            parts = new
        return parts

    def _score(self, a: str, b: str):
        """SPM: a pair merges into the piece a + b, highest score first."""
        tid = self.ids.get(a + b)
        return None if tid is None else -self.scores[tid]

    def _rank(self, a: str, b: str):
        """BPE: a pair the merges list, lowest rank first."""
        return self.ranks.get((a, b))

    def _spm(self, text: str) -> list:
        return self._merge(text, self._score)

    def _merge(self, text: str, priority) -> list:
        """Adjacent symbols (from characters) merged, the pair of lowest ``priority(a, b)``
        first (None: no merge), ties to the leftmost; then each symbol's token, or its bytes'."""
        syms = [_Sym(i, 1, i - 1, i + 1 if i + 1 < len(text) else -1) for i in range(len(text))]
        heap: list = []

        def bigram(left, right):
            if left < 0 or right < 0:
                return
            a, b = syms[left], syms[right]
            p = priority(text[a.start:a.start + a.n], text[b.start:b.start + b.n])
            if p is not None:
                heapq.heappush(heap, (p, left, right, a.n + b.n))

        for i in range(1, len(syms)):
            bigram(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if a.n == 0 or b.n == 0 or a.n + b.n != size:
                continue
            a.n += b.n
            b.n = 0
            a.next = b.next
            if b.next >= 0:
                syms[b.next].prev = left
            bigram(a.prev, left)
            bigram(left, a.next)
        out = []
        i = 0 if syms else -1
        while i >= 0:
            s = syms[i]
            piece = text[s.start:s.start + s.n]
            tid = self.ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out += [self._byte_token(b) for b in piece.encode()]
            i = s.next
        return out

    def _byte_token(self, b: int) -> int:
        tid = self.ids.get(f"<0x{b:02X}>")
        if tid is None:
            tid = self.ids.get(chr(b))
        if tid is None:
            raise GGUFError(f"{self.path}: the vocabulary has no token for byte 0x{b:02X}")
        return tid

    # ------------------------------------------------------------------ ids to text
    def piece(self, tid: int, special: bool = True) -> bytes:
        """The bytes token ``tid`` stands for (control tokens: their text if ``special``)."""
        t = self.types[tid]
        text = self.tokens[tid]
        if t in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if t == USER_DEFINED:
            return text.encode()
        if self.model in ("llama", "gemma4"):
            if t == BYTE:
                return bytes([int(text[3:5], 16)])
            return text.replace("\u2581", " ").encode()
        if self._bytes is None:
            self._bytes = {c: b for b, c in enumerate(byte_tokens())}
        try:
            return bytes(self._bytes[c] for c in text)
        except KeyError:
            return text.encode()

    def decode(self, ids, special: bool = False) -> str:
        """The text of ``ids``; for a llama tokenizer, without the leading space it adds."""
        raw = b"".join(self.piece(i, special) for i in ids)
        if self.model == "llama" and self.add_space_prefix and raw.startswith(b" "):
            first = next((i for i in ids if self.types[i] not in (CONTROL, UNKNOWN)), None)
            if first is not None and self.types[first] != USER_DEFINED:
                raw = raw[1:]
        return raw.decode("utf-8", errors="replace")


def _bpe(tokens, merges, exprs, ignore, path):
    try:
        from tokenizers import Regex, Tokenizer as HFTokenizer, models, pre_tokenizers
    except ImportError as e:
        raise GGUFError(f"{path}: a gpt2 tokenizer needs the 'tokenizers' package ({e})")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise GGUFError(f"{path}: merge {m!r} is not two pieces")
        # a merge whose pieces or result are no token can only give llama.cpp a symbol it
        # spells back as its bytes (smallem's own byte-vocabulary export has one such): left out
        if a in vocab and b in vocab and a + b in vocab:
            pairs.append((a, b))
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore)
    except Exception as e:  # noqa: BLE001 - a merge of pieces not in the vocabulary
        raise GGUFError(f"{path}: the merges do not fit the vocabulary ({e})")
    tk = HFTokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in exprs]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tk


def from_model_file(mf) -> Tokenizer:
    return Tokenizer(mf.tokenizer, mf.path)
