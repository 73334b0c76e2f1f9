"""Reading a study file: its bytes as UTF-8 text, and YAML parsed safely with the rules a study needs."""

from __future__ import annotations

import errno
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from studies.spec._schema import StudyError
from trainables.errors import shown

# Bounds on what a study file may ask of this process before anything runs: its size, and the values its YAML
# aliases expand to (an alias bomb of 1 KB expands to gigabytes).
MAX_STUDY_FILE_BYTES = 1_000_000
MAX_YAML_NODES = 100_000


class _StudyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (the last would win without a word)."""

    def __init__(self, stream):
        super().__init__(stream)
        self.surprises: list[str] = []  # YAML 1.1 readings the writer rarely means, reported together afterwards

    def construct_yaml_bool(self, node):
        value = super().construct_yaml_bool(node)
        if node.style is None and node.value.lower() not in ("true", "false"):
            self.surprises.append(
                f"line {node.start_mark.line + 1}: {node.value} is read as the boolean {str(value).lower()} (YAML 1.1). "
                f"Fix: write {str(value).lower()} for a boolean, or quote it ('{node.value}') for the text."
            )
        return value

    def construct_yaml_str(self, node):
        value = super().construct_yaml_str(node)
        if node.style is None and isinstance(value, str) and _FLOAT_WITHOUT_DOT.fullmatch(value):
            dotted = re.sub(r"^([-+]?[0-9_]+)", r"\1.0", value)
            self.surprises.append(
                f"line {node.start_mark.line + 1}: {value} is read as the text {value!r}: YAML 1.1 reads a number with "
                f"an exponent as a float only with a dot in it. Fix: write {dotted} (or {float(value)!r}), or quote "
                f"it if the text is meant."
            )
        return value

    def flatten_mapping(self, node):
        """Merge keys by the YAML rule: the mapping's own keys win, then the first merged map naming a key.

        PyYAML de-duplicates merged keys by the identity of their text objects, so with keys of more than one
        character the last map of `<<: [*a, *b]` won where the rule says the first does."""
        merged: dict[Any, tuple[Any, Any]] = {}
        own = []
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.tag == "tag:yaml.org,2002:value":
                    key_node.tag = "tag:yaml.org,2002:str"
                own.append((key_node, value_node))
                continue
            sources = [value_node] if isinstance(value_node, yaml.MappingNode) else value_node.value
            if not isinstance(value_node, (yaml.MappingNode, yaml.SequenceNode)) or not all(
                isinstance(source, yaml.MappingNode) for source in sources
            ):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "a merge key `<<:` takes a mapping or a list of mappings (`<<: [*a, *b]`)",
                    value_node.start_mark,
                )
            for source in sources:
                self.flatten_mapping(source)
                effective = {self._merge_identity(k): (k, v) for k, v in source.value}  # its own last key wins
                for identity, pair in effective.items():
                    merged.setdefault(identity, pair)
        node.value = [*merged.values(), *own]

    def _merge_identity(self, key_node) -> Any:
        if isinstance(key_node, yaml.ScalarNode):
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
                return ("key", key)
            except TypeError:
                pass
        return ("node", id(key_node))

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            merges = [k for k, _ in node.value if k.tag == "tag:yaml.org,2002:merge"]
            if len(merges) > 1:
                self.surprises.append(
                    f"line {merges[1].start_mark.line + 1}: {len(merges)} `<<:` merge keys in one mapping, where YAML allows "
                    f"one (a key is given once; readers differ on the others). Fix: one merge key with a list, `<<: [*a, *b]` "
                    f"(where two of them set one key, the first listed wins)."
                )
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping",
                            node.start_mark,
                            f"found the key {shown(key)} twice (lines {seen[key].start_mark.line + 1} and "
                            f"{key_node.start_mark.line + 1}): the last would silently win; keep one",
                            key_node.start_mark,
                        )
                    seen[key] = key_node
                except TypeError:
                    pass  # an unhashable key: the base loader reports it
        return super().construct_mapping(node, deep=deep)


_StudyLoader.add_constructor("tag:yaml.org,2002:bool", _StudyLoader.construct_yaml_bool)
_StudyLoader.add_constructor("tag:yaml.org,2002:str", _StudyLoader.construct_yaml_str)
# 1e-2, 5E+3: numbers to a reader, text to YAML 1.1 (which PyYAML follows).
_FLOAT_WITHOUT_DOT = re.compile(r"[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+")


def _expanded_nodes(node, limit: int) -> int:
    """How many nodes `node` stands for once every alias is expanded, counted up to just past `limit`.

    Aliases share their node, so the graph is small while its expansion may not be: the count is memoised per
    node, which keeps it fast on an alias bomb."""
    sizes: dict[int, int] = {}

    def size(n) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = limit + 1  # a cycle (a recursive alias) counts as too large
        if isinstance(n, yaml.SequenceNode):
            total = 1 + sum(size(c) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in n.value)
        else:
            total = 1
        sizes[id(n)] = min(total, limit + 1)
        return sizes[id(n)]

    return size(node)


def _reader_problem(where: str, text: str, err: Exception) -> str:
    """A character YAML refuses (NUL, ESC and other control characters): where it is, and the fix."""
    position = getattr(err, "position", None)
    character = getattr(err, "character", None)
    if position is None or character is None:
        return f"{where}: not readable as YAML text ({str(err)[:300]}). Fix: save it as plain UTF-8 text."
    line = text.count("\n", 0, position) + 1
    code = character if isinstance(character, int) else ord(character)
    return (
        f"{where}: line {line} holds the control character U+{code:04X}, which YAML does not allow in a file. "
        f"Fix: delete it (an editor's 'show invisibles' shows it)."
    )


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML safely: no tags beyond plain data, no key twice in a mapping, aliases expanding to at most
    MAX_YAML_NODES nodes. Raises ValueError with one line: `where`, the rule, the value, the fix."""
    try:
        loader = _StudyLoader(text)
    except yaml.YAMLError as err:
        raise ValueError(_reader_problem(where, text, err)) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise ValueError(
                f"{where}: YAML aliases may expand to at most {MAX_YAML_NODES} values, and these expand to more "
                f"(an alias bomb, or a recursive alias). Fix: write the values out, or use fewer nested aliases."
            )
        document = loader.construct_document(node)
        if loader.surprises:
            raise ValueError("\n".join(f"{where}: {s}" for s in loader.surprises))
        return document
    except yaml.reader.ReaderError as err:
        raise ValueError(_reader_problem(where, text, err)) from None
    except yaml.YAMLError as err:
        text = str(err)
        if len(text) > 600:
            text = text[:600] + "..."
        raise ValueError(f"{where}: YAML syntax: {text}. Fix: correct the YAML.") from None
    except RecursionError:
        raise ValueError(
            f"{where}: nested too deeply to read (brackets or indentation hundreds of levels deep). Fix: a study "
            f"file nests a few levels; close the brackets, or flatten the structure."
        ) from None
    finally:
        loader.dispose()


def _not_a_file_problem(path: Path) -> str | None:
    """What stands at `path` when it is no regular file, said from its stat alone: a FIFO is never opened (reading
    one blocks until some writer comes)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"study file: does not exist (looked at {path.resolve()}). Fix: check the path."
    except OSError as err:
        return f"study file: cannot be looked at ({err.strerror}, at {path.absolute()}). Fix: check the path and its permissions."
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        inside = sorted(p.name for p in path.glob("*.yaml") if p.is_file())[:3]
        hint = f", e.g. {path / inside[0]} (it holds {', '.join(inside)})" if inside else ""
        return f"study file: {path} is a directory, not a study file. Fix: give the YAML file of the study{hint}."
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")
    return (
        f"study file: {path} is {kind}, not a regular file, and is not read (a pipe would block until written to). "
        f"Fix: save the study to a file and give its path."
    )


_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def read_study_text(path: Path) -> str:
    """The study file's text: at most MAX_STUDY_FILE_BYTES of UTF-8; a StudyError says what else it is."""
    try:
        resolved = path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a symlink loop so
        resolved = None
    except OSError as err:
        resolved = None if err.errno == errno.ELOOP else path.absolute()
    if resolved is None:
        raise StudyError(
            path,
            [f"study file: {path} is a symbolic link that leads back to itself (a loop). Fix: give the file itself."],
        )
    if resolved.parts[1:2] in (("proc",), ("sys",), ("dev",)):
        raise StudyError(
            path,
            [
                f"study file: {resolved} is a system file (under /{resolved.parts[1]}), not a study. Fix: check the path."
            ],
        )
    if (problem := _not_a_file_problem(path)) is not None:
        raise StudyError(path, [problem])
    try:
        with path.open("rb") as f:
            data = f.read(MAX_STUDY_FILE_BYTES + 1)
    except OSError as err:
        raise StudyError(
            path, [f"study file: cannot be read ({err.strerror}). Fix: check the path and its permissions."]
        )
    if len(data) > MAX_STUDY_FILE_BYTES:
        raise StudyError(
            path,
            [
                (
                    f"study file: at most {MAX_STUDY_FILE_BYTES} bytes (a study names its settings, it holds no data), got "
                    f"{path.stat().st_size} bytes. Fix: keep data and long lists out of it (data.root names the data)."
                )
            ],
        )
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise StudyError(
            path,
            [
                (
                    "study file: must be UTF-8 text, got UTF-16 (it starts with a UTF-16 byte-order mark). "
                    "Fix: save it as UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)."
                )
            ],
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise StudyError(
            path,
            [
                (
                    f"study file: must be UTF-8 text, got byte {data[err.start]:#04x} on line {line}, which is not UTF-8. "
                    f"Fix: save the file as UTF-8."
                )
            ],
        ) from None
