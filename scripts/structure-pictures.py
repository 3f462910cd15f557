#!/usr/bin/env python3
"""Before/after pictures of the code's structure (issue 26): each crate's file
import graph, with its cycles in red, and the repeated code per crate.

For each revision (BEFORE, AFTER) the crates/ tree is exported with `git archive`
into a temporary directory (the checkout is not touched), then:

1. Import graph: a node per module file under crates/<crate>/src (src/a/b.rs and
   src/a/b/mod.rs are module `a::b`; lib.rs/main.rs the root). An edge m -> n when
   m's code names n: a `use` of `crate::`, `super::` or `self::` paths (brace
   groups expanded), such a path anywhere in the code, or `child::` of a module m
   declares. A path names the longest module prefix it has (`crate::a::b::X` is
   `a::b` if that file exists, else `a`); `super::`/`self::` inside an inline
   `mod name { }` start from that inline module. `mod` declarations alone are no edge,
   inline `#[cfg(test)] mod ... { }` blocks, comments and strings are left out.
   A cycle is a strongly connected component of two or more files: its files and
   the edges inside it are drawn red. One PNG per revision, a panel per crate,
   the files on a circle in path order.
2. Repeated code: `duplicates --repo <tree>/crates/<crate> --min-lines 6` counts the
   pairs of places in a crate that share 6 or more lines (same text or same shape);
   one grouped bar chart, BEFORE and AFTER per crate, the totals in the legend.

A table of both (files, edges, largest cycle, duplicate pairs per crate) goes to
stdout in Markdown.

Usage: .venv/bin/python scripts/structure-pictures.py [--before REV] [--after REV]
           [--out DIR]
Defaults: --before 6247945 (the review of issue 26), --after HEAD, --out docs/img.
Needs matplotlib and networkx (in .venv) and the `duplicates` command.
"""

import argparse
import io
import math
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def export_tree(rev, into):
    """Writes the crates/ tree of `rev` under `into`; returns the commit's short id."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev],
                            check=True, capture_output=True, text=True).stdout.strip()
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "crates"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return commit


# --- reading Rust sources -------------------------------------------------------------

RAW_STRING = re.compile(r'r(#+)".*?"\1', re.S)
STRING = re.compile(r'b?"(?:\\.|[^"\\])*"', re.S)
CHAR = re.compile(r"b?'(?:\\.|[^'\\\n])'")
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
LINE_COMMENT = re.compile(r"//[^\n]*")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*\w+)+)")
MOD_DECL = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
CHILD_REF = re.compile(r"(?<![\w:])(\w+)\s*::\s*\w")
INLINE_MOD = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?\bmod\s+(\w+)\s*\{")


def code_only(text):
    """`text` without comments, string and char literals, and inline test modules."""
    text = RAW_STRING.sub('""', text)
    text = BLOCK_COMMENT.sub(" ", text)
    text = STRING.sub('""', text)
    text = LINE_COMMENT.sub("", text)
    text = CHAR.sub("' '", text)
    while True:
        m = TEST_MOD.search(text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + text[i:]


def expand_use(tree):
    """The paths of a use tree: `crate::{a::X, b::{Y, Z}}` -> crate::a::X, crate::b::Y, ..."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree.split(" as ")[0]]
    prefix, inner = tree[:brace], tree[brace + 1:tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    out = []
    for p in parts:
        if p:
            out.extend(expand_use(prefix + p))
    return out


def module_of(src, path):
    """Module path (tuple) of a file under src/: () for lib.rs/main.rs."""
    rel = path.relative_to(src).with_suffix("").parts
    if rel[-1] == "mod" or (len(rel) == 1 and rel[0] in ("lib", "main")):
        rel = rel[:-1]
    return tuple(rel)


def crate_graph(src):
    """The module graph of one crate's src/: (graph, labels)."""
    files = sorted(p for p in src.rglob("*.rs") if "bin" not in p.relative_to(src).parts[:1])
    modules = {}
    for f in files:
        modules.setdefault(module_of(src, f), f)
    g = nx.DiGraph()
    for m in modules:
        g.add_node(m)

    def resolve(base, segments):
        # Longest module prefix of base + segments that is a file.
        full = tuple(base) + tuple(segments)
        for n in range(len(full), -1, -1):
            if full[:n] in modules:
                return full[:n]
        return ()

    for m, f in modules.items():
        text = code_only(f.read_text(errors="replace"))
        children = {c for c in MOD_DECL.findall(text)}
        # Inline `mod name { ... }` blocks (not files): `super::`/`self::` in
        # them start from the inline module, so `super::X` inside one names
        # its own file, not the file's parent.
        inline = []
        for im in INLINE_MOD.finditer(text):
            depth, i = 1, im.end()
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            inline.append((im.start(), i, im.group(1)))

        def inline_path(pos):
            return tuple(name for start, end, name in inline if start < pos < end)

        paths = []
        for um in USE.finditer(text):
            paths.extend((p, inline_path(um.start())) for p in expand_use(um.group(1)))
        paths.extend((pm.group(1) + pm.group(2), inline_path(pm.start()))
                     for pm in PATH.finditer(text))
        for p, within in paths:
            segs = [s for s in re.sub(r"\s+", "", p).split("::") if s and s not in ("*",)]
            if not segs:
                continue
            head, rest = segs[0], segs[1:]
            if head == "crate":
                target = resolve((), rest)
            elif head in ("super", "self"):
                base = list(m) + list(within)
                while segs and segs[0] in ("super", "self"):
                    if segs.pop(0) == "super" and base:
                        base.pop()
                target = resolve(base, segs)
            elif head in children:
                target = resolve(m, segs)
            else:
                continue
            if target != m:
                g.add_edge(m, target)
        for name in CHILD_REF.findall(text):
            if name in children and m + (name,) in modules:
                g.add_edge(m, m + (name,))
    labels = {m: ("lib" if not m else "::".join(m)) for m in modules}
    return g, labels


def cycles(g):
    return [c for c in nx.strongly_connected_components(g) if len(c) > 1]


# --- duplicates ------------------------------------------------------------------------

def duplicate_pairs(crate_dir):
    out = subprocess.run(["duplicates", "--repo", str(crate_dir), "--min-lines", "6",
                          "--most", "1", "--seconds", "120"],
                         capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out else ""
    if "incomplete:" in out:
        print(f"warning: duplicates incomplete for {crate_dir.name}", file=sys.stderr)
    m = re.match(r"(\d+) pairs? of places", first)
    if m:
        return int(m.group(1))
    if first.startswith("no duplicates"):
        return 0
    raise RuntimeError(f"duplicates said: {out[:300]!r}")


# --- drawing ---------------------------------------------------------------------------

def save_small(fig, path, colors=48):
    """Saves `fig` as a palette PNG (a few colors suffice for lines and text)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    buf.seek(0)
    img = Image.open(buf).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    img.save(path, optimize=True)
    return path.stat().st_size


def draw_graphs(title, graphs, path):
    crates = sorted(graphs, key=lambda c: -graphs[c][0].number_of_nodes())
    # The crate with the most files gets a 2x2 block, the others a cell each.
    cols = 5
    rows = (len(crates) + 3 + cols - 1) // cols
    fig = plt.figure(figsize=(cols * 4.4, rows * 4.4), dpi=72)
    grid = fig.add_gridspec(rows, cols)
    cells = [grid[0:2, 0:2]] + [grid[r, c] for r in range(rows) for c in range(cols)
                                if not (r < 2 and c < 2)]
    for crate, cell in zip(crates, cells):
        ax = fig.add_subplot(cell)
        ax.axis("off")
        g, labels = graphs[crate]
        cyc = cycles(g)
        in_cycle = {n for c in cyc for n in c}
        comp = {n: i for i, c in enumerate(cyc) for n in c}
        red_edges = [(a, b) for a, b in g.edges if a in comp and comp[a] == comp.get(b)]
        other_edges = [e for e in g.edges if e not in set(red_edges)]
        # Files on a circle in path order (a directory's files side by side),
        # so the picture is the same on every run and chords show the edges.
        order = sorted(g.nodes, key=lambda n: labels[n] if n else "")
        step = 2 * math.pi / max(len(order), 1)
        pos = {n: (math.cos(math.pi / 2 - i * step), math.sin(math.pi / 2 - i * step))
               for i, n in enumerate(order)}
        nx.draw_networkx_edges(g, pos, edgelist=other_edges, ax=ax, edge_color="#b0b0b0",
                               width=0.5, arrowsize=5, node_size=25)
        nx.draw_networkx_edges(g, pos, edgelist=red_edges, ax=ax, edge_color="#d62728",
                               width=0.9, arrowsize=6, node_size=25)
        nx.draw_networkx_nodes(g, pos, ax=ax, node_size=25,
                               node_color=["#d62728" if n in in_cycle else "#1f77b4"
                                           for n in g.nodes])
        for i, n in enumerate(order):
            angle = math.degrees(math.pi / 2 - i * step) % 360
            left = 90 < angle < 270
            x, y = pos[n]
            ax.text(1.07 * x, 1.07 * y, labels[n], fontsize=8 if crate == crates[0] else 5.5,
                    rotation=angle - 180 if left else angle, rotation_mode="anchor",
                    ha="right" if left else "left", va="center",
                    color="#d62728" if n in in_cycle else "black")
        ax.set_xlim(-1.9, 1.9)
        ax.set_ylim(-1.9, 1.9)
        ax.set_aspect("equal")
        largest = max((len(c) for c in cyc), default=0)
        ax.set_title(f"{crate}\n{g.number_of_nodes()} files, {g.number_of_edges()} edges, "
                     f"largest cycle {largest}", fontsize=8)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return save_small(fig, path)


def draw_duplicates(before, after, labels, path):
    crates = sorted(set(before) | set(after), key=lambda c: -(before.get(c, 0) + after.get(c, 0)))
    x = range(len(crates))
    fig, ax = plt.subplots(figsize=(11, 4.2), dpi=80)
    w = 0.4
    ax.bar([i - w / 2 for i in x], [before.get(c, 0) for c in crates], w,
           label=f"{labels[0]}: {sum(before.values())} pairs", color="#9a9a9a")
    ax.bar([i + w / 2 for i in x], [after.get(c, 0) for c in crates], w,
           label=f"{labels[1]}: {sum(after.values())} pairs", color="#1f77b4")
    ax.set_xticks(list(x), [c.removeprefix("ferrite-") or c for c in crates], rotation=40,
                  ha="right", fontsize=8)
    ax.set_ylabel("pairs of places sharing 6+ lines")
    ax.set_title("Repeated code within each crate (`duplicates --min-lines 6`)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    return save_small(fig, path, colors=24)


def snapshot(rev, tmp):
    tree = Path(tmp) / rev.replace("/", "_")
    tree.mkdir()
    commit = export_tree(rev, tree)
    graphs, dups = {}, {}
    for crate_dir in sorted((tree / "crates").iterdir()):
        if not (crate_dir / "Cargo.toml").exists():
            continue
        if (crate_dir / "src").is_dir():
            graphs[crate_dir.name] = crate_graph(crate_dir / "src")
        dups[crate_dir.name] = duplicate_pairs(crate_dir)
    return commit, graphs, dups


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default="6247945")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--out", default=str(ROOT / "docs/img"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="structure-") as tmp:
        b_commit, b_graphs, b_dups = snapshot(args.before, tmp)
        a_commit, a_graphs, a_dups = snapshot(args.after, tmp)
    sizes = {
        "import-graph-before.png": draw_graphs(
            f"File import graph per crate at {b_commit} (red: files in an import cycle)",
            b_graphs, out / "import-graph-before.png"),
        "import-graph-after.png": draw_graphs(
            f"File import graph per crate at {a_commit} (red: files in an import cycle)",
            a_graphs, out / "import-graph-after.png"),
        "duplicates.png": draw_duplicates(b_dups, a_dups, (b_commit, a_commit),
                                          out / "duplicates.png"),
    }
    for name, size in sizes.items():
        print(f"wrote {out / name} ({size // 1024} KiB)", file=sys.stderr)
    print(f"| crate | files {b_commit} -> {a_commit} | edges | largest cycle | "
          f"duplicate pairs |")
    print("|---|---|---|---|---|")
    for crate in sorted(set(b_graphs) | set(a_graphs) | set(b_dups) | set(a_dups)):
        def stats(graphs):
            if crate not in graphs:
                return ("-", "-", "-")
            g = graphs[crate][0]
            return (g.number_of_nodes(), g.number_of_edges(),
                    max((len(c) for c in cycles(g)), default=0))
        bf, be, bc = stats(b_graphs)
        af, ae, ac = stats(a_graphs)
        print(f"| {crate} | {bf} -> {af} | {be} -> {ae} | {bc} -> {ac} | "
              f"{b_dups.get(crate, '-')} -> {a_dups.get(crate, '-')} |")


if __name__ == "__main__":
    main()
