#!/usr/bin/env python3
"""Assembles the mini-K3 training corpus (issue 17, item 1) from Debian packages.

Real English prose and source code, all from packages Debian's archive serves, fetched with
`apt-get download` and unpacked with `dpkg-deb -x` (nothing else is downloaded):

| source        | package (pinned)                  | what is taken                                   | license |
|---------------|-----------------------------------|-------------------------------------------------|---------|
| python-docs   | python3.11-doc                    | the reStructuredText sources of the docs         | PSF-2.0 |
| linux-docs    | linux-doc-6.1                     | Documentation/**/*.rst and *.txt (gzipped)       | GPL-2.0-only (some files dual, see their SPDX lines) |
| rust-books    | rust-doc                          | The Book, Reference, Nomicon, Rust by Example, edition guide, rustc book (HTML -> text) | MIT OR Apache-2.0 |
| rust-library  | rust-src                          | library/**/*.rs (the standard library source)    | MIT OR Apache-2.0 |
| rust-compiler | rust-src                          | compiler/**/*.rs (the first 8 MB, path order)    | MIT OR Apache-2.0 |
| cpython-lib   | libpython3.11-stdlib, -minimal    | the standard library's *.py                      | PSF-2.0 |

Each document (one file) goes to the held-out split when the first 4 bytes of SHA-256("source/path") taken as
an integer are < 2% of 2^32: a fixed split that does not depend on file order, machine or Python version.

Output (under --out, default /work/mini-artifacts/corpus): `train.txt`, `heldout.txt` (documents separated by
the ASCII record separator 0x1E, which no kept document contains) and `manifest.json`; the manifest (per source:
package, version, .deb SHA-256, license, documents and bytes per split, and the SHA-256 of both text files) is
also written to tools/mini/corpus_manifest.json so the corpus can be checked when re-built.

Usage: python3 tools/mini/corpus.py [--out DIR] [--cache DIR]
"""

import argparse
import gzip
import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys

SEP = "\x1e"
HELDOUT_PERCENT = 2
MIN_DOC, MAX_DOC = 200, 400_000  # bytes; tiny stubs and huge generated files are skipped

PACKAGES = {
    "python3.11-doc": "3.11.2-6+deb12u9",
    "linux-doc-6.1": "6.1.192-3",
    "rust-doc": "1.63.0+dfsg1-2",
    "rust-src": "1.63.0+dfsg1-2",
    "libpython3.11-stdlib": "3.11.2-6+deb12u9",
    "libpython3.11-minimal": "3.11.2-6+deb12u9",
}

SOURCES = [
    # name, packages, license, byte cap (train+heldout), description
    ("python-docs", ["python3.11-doc"], "PSF-2.0", 12_000_000, "Python 3.11 documentation, reST sources"),
    ("linux-docs", ["linux-doc-6.1"], "GPL-2.0-only (some files dual-licensed; see their SPDX lines)",
     24_000_000, "Linux 6.1 Documentation/, reST and text"),
    ("rust-books", ["rust-doc"], "MIT OR Apache-2.0", 12_000_000,
     "The Rust Programming Language, Reference, Nomicon, Rust by Example, Edition Guide, rustc book (text of HTML)"),
    ("rust-library", ["rust-src"], "MIT OR Apache-2.0", 18_000_000, "Rust 1.63 standard library source (*.rs)"),
    ("rust-compiler", ["rust-src"], "MIT OR Apache-2.0", 8_000_000, "Rust 1.63 compiler source (compiler/**/*.rs)"),
    ("cpython-lib", ["libpython3.11-stdlib", "libpython3.11-minimal"], "PSF-2.0", 12_000_000,
     "CPython 3.11 standard library (*.py)"),
]

RUST_BOOKS = ["book", "reference", "nomicon", "rust-by-example", "edition-guide", "rustc"]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(cache):
    """apt-get download + dpkg-deb -x each pinned package once; returns {package: (root, deb_sha256)}."""
    os.makedirs(cache, exist_ok=True)
    out = {}
    for pkg, ver in PACKAGES.items():
        debs = [f for f in os.listdir(cache) if f.startswith(pkg + "_") and f.endswith(".deb")]
        if not debs:
            subprocess.run(["apt-get", "download", f"{pkg}={ver}"], cwd=cache, check=True)
            debs = [f for f in os.listdir(cache) if f.startswith(pkg + "_") and f.endswith(".deb")]
        deb = os.path.join(cache, sorted(debs)[-1])
        root = os.path.join(cache, "x", pkg)
        if not os.path.isdir(root):
            os.makedirs(root + ".tmp", exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", deb, root + ".tmp"], check=True)
            os.rename(root + ".tmp", root)
        out[pkg] = (root, sha256_file(deb), os.path.basename(deb))
    return out


class TextOfHtml(html.parser.HTMLParser):
    """Visible text of an mdBook page's <main> element, with block elements on their own lines."""

    BLOCK = {"p", "div", "pre", "li", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "br", "blockquote", "dt", "dd"}
    SKIP = {"script", "style", "nav", "button"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.in_main, self.skip, self.pre = [], 0, 0, 0

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.in_main += 1
        elif tag in self.SKIP:
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
        if tag in self.BLOCK and self.in_main:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "main":
            self.in_main -= 1
        elif tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in self.BLOCK and self.in_main:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.in_main and not self.skip:
            self.parts.append(data if self.pre else re.sub(r"[ \t\r\n]+", " ", data))

    def text(self):
        t = "".join(self.parts)
        t = "\n".join(line.rstrip() for line in t.split("\n"))
        return re.sub(r"\n{3,}", "\n\n", t).strip() + "\n"


def walk(root, pred):
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            if pred(p) and not os.path.islink(p):
                yield p


def read_text(path):
    raw = open(path, "rb").read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def documents(name, roots):
    """Yields (relative path, text) for one source, in a fixed order."""
    if name == "python-docs":
        r = roots["python3.11-doc"]
        for p in walk(r, lambda p: "/_sources/" in p and p.endswith(".txt")):
            yield os.path.relpath(p, r), read_text(p)
    elif name == "linux-docs":
        r = roots["linux-doc-6.1"]
        for p in walk(r, lambda p: "/Documentation/" in p and re.search(r"\.(rst|txt)(\.gz)?$", p)):
            yield os.path.relpath(p, r), read_text(p)
    elif name == "rust-books":
        r = os.path.join(roots["rust-doc"], "usr/share/doc/rust-doc/html")
        for book in RUST_BOOKS:
            for p in walk(os.path.join(r, book), lambda p: p.endswith(".html") and not p.endswith("print.html")
                          and not p.endswith("toc.html") and not p.endswith("404.html")):
                text = read_text(p)
                if text is None:
                    continue
                parser = TextOfHtml()
                parser.feed(text)
                yield os.path.relpath(p, r), parser.text()
    elif name == "rust-library":
        r = roots["rust-src"]
        for p in walk(r, lambda p: "/library/" in p and p.endswith(".rs") and "/tests/" not in p
                      and "/benches/" not in p and "/stdarch/" not in p):
            yield os.path.relpath(p, r), read_text(p)
    elif name == "rust-compiler":
        r = roots["rust-src"]
        for p in walk(r, lambda p: "/compiler/" in p and p.endswith(".rs") and "/tests/" not in p):
            yield os.path.relpath(p, r), read_text(p)
    elif name == "cpython-lib":
        for pkg in ("libpython3.11-minimal", "libpython3.11-stdlib"):
            r = roots[pkg]
            for p in walk(r, lambda p: p.endswith(".py") and "/test/" not in p):
                yield os.path.relpath(p, r), read_text(p)


def is_heldout(source, rel):
    h = hashlib.sha256(f"{source}/{rel}".encode()).digest()
    return int.from_bytes(h[:4], "big") < (HELDOUT_PERCENT * (1 << 32)) // 100


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/work/mini-artifacts/corpus")
    ap.add_argument("--cache", default="/work/mini-artifacts/debs")
    ap.add_argument("--manifest", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "corpus_manifest.json"))
    args = ap.parse_args()
    fetched = fetch(args.cache)
    roots = {p: v[0] for p, v in fetched.items()}
    os.makedirs(args.out, exist_ok=True)
    files = {s: open(os.path.join(args.out, f"{s}.txt.tmp"), "w", encoding="utf-8") for s in ("train", "heldout")}
    manifest = {"generator": "tools/mini/corpus.py", "heldout_percent": HELDOUT_PERCENT, "separator": "0x1E",
                "sources": []}
    for name, pkgs, lic, cap, desc in SOURCES:
        stats = {"train": [0, 0], "heldout": [0, 0]}
        skipped, total = 0, 0
        for rel, text in documents(name, roots):
            if text is None or SEP in text:
                skipped += 1
                continue
            text = text.replace("\r\n", "\n")
            n = len(text.encode("utf-8"))
            if n < MIN_DOC or n > MAX_DOC:
                skipped += 1
                continue
            if total + n > cap:
                break
            total += n
            split = "heldout" if is_heldout(name, rel) else "train"
            files[split].write(text + SEP)
            stats[split][0] += 1
            stats[split][1] += n
        manifest["sources"].append({
            "name": name, "description": desc, "license": lic,
            "packages": [{"package": p, "version": PACKAGES[p], "deb": fetched[p][2], "deb_sha256": fetched[p][1]}
                         for p in pkgs],
            "train_docs": stats["train"][0], "train_bytes": stats["train"][1],
            "heldout_docs": stats["heldout"][0], "heldout_bytes": stats["heldout"][1], "skipped_docs": skipped,
        })
        print(f"{name}: train {stats['train'][0]} docs {stats['train'][1] / 1e6:.1f} MB, heldout "
              f"{stats['heldout'][0]} docs {stats['heldout'][1] / 1e6:.2f} MB, skipped {skipped}", flush=True)
    for s, f in files.items():
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(os.path.join(args.out, f"{s}.txt.tmp"), os.path.join(args.out, f"{s}.txt"))
        manifest[f"{s}_sha256"] = sha256_file(os.path.join(args.out, f"{s}.txt"))
        manifest[f"{s}_bytes"] = os.path.getsize(os.path.join(args.out, f"{s}.txt"))
    for path in (os.path.join(args.out, "manifest.json"), args.manifest):
        with open(path + ".tmp", "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
        os.replace(path + ".tmp", path)
    print(f"train {manifest['train_bytes'] / 1e6:.1f} MB, heldout {manifest['heldout_bytes'] / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
