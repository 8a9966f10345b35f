"""Print SGLang's launch_server option names as JSON, read from its source without importing it.

    python tools/sglang_flags.py path/to/site-packages-or-unzipped-wheel > flags.json

SGLang (0.5.x) declares most server arguments as annotated dataclass fields in
sglang/srt/arg_groups/fields/*.py (`name: A[type, "help"]` or `A[type, Arg(..., cli_name=..., aliases=[...],
no_cli=...)]`; the option is `--` + the name with dashes unless cli_name says otherwise) and adds the rest with
`parser.add_argument(...)` in sglang/srt/server_args.py. Used to fill specs/stack_flags.json."""
import ast
import json
import sys
from pathlib import Path


def _arg_call(node):
    """The Arg(...) call inside A[type, Arg(...)], or None for A[type, "help"]."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "A":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for e in elts[1:]:
            if isinstance(e, ast.Call) and getattr(e.func, "id", None) == "Arg":
                return e
        return False
    return None


def field_flags(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        call = _arg_call(node.annotation)
        if call is None:
            continue
        kw = {k.arg: k.value for k in call.keywords} if call else {}
        if "no_cli" in kw and isinstance(kw["no_cli"], ast.Constant) and kw["no_cli"].value:
            continue
        name = kw["cli_name"].value if "cli_name" in kw else "--" + node.target.id.replace("_", "-")
        out.add(name)
        if "aliases" in kw and isinstance(kw["aliases"], (ast.List, ast.Tuple)):
            out |= {e.value for e in kw["aliases"].elts if isinstance(e, ast.Constant)}
    return out


def add_argument_flags(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return out


def main(root: str) -> None:
    base = Path(root) / "sglang" / "srt"
    flags = set()
    for p in sorted((base / "arg_groups" / "fields").glob("*.py")):
        flags |= field_flags(p)
    flags |= add_argument_flags(base / "server_args.py")
    print(json.dumps(sorted(flags), indent=0))


if __name__ == "__main__":
    main(sys.argv[1])
