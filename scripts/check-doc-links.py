#!/usr/bin/env python3
"""Resolves every [text](file.md#anchor) and [text](#anchor) in docs/*.md,
README.md and CHANGELOG.md against GitHub-style heading slugs; prints each
link that does not resolve (file:line: target) and exits 1 if any.
Usage: python3 scripts/check-doc-links.py [repo root]"""
import os, re, sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r'\]\(([^)\s]*?)(#[^)\s]*)?\)')


def slug(text):
    # GitHub: lower case, drop what is not a word character, space or
    # hyphen, spaces to hyphens; markdown code ticks and links are dropped
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)
    text = text.strip().lower().replace('`', '')
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    seen, out, fence = {}, set(), False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.lstrip().startswith('```'):
                fence = not fence
                continue
            m = None if fence else re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
            if not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else '%s-%d' % (s, n))
            seen[s] = n + 1
    return out


def sources():
    docs = os.path.join(ROOT, 'docs')
    for name in sorted(os.listdir(docs)):
        if name.endswith('.md'):
            yield os.path.join(docs, name)
    for name in ('README.md', 'CHANGELOG.md'):
        if os.path.exists(os.path.join(ROOT, name)):
            yield os.path.join(ROOT, name)


def main():
    cache, bad = {}, 0
    for src in sources():
        fence = False
        with open(src, encoding='utf-8') as f:
            lines = f.readlines()
        for no, line in enumerate(lines, 1):
            if line.lstrip().startswith('```'):
                fence = not fence
            if fence:
                continue
            for m in LINK.finditer(line):
                target, frag = m.group(1), m.group(2)
                if re.match(r'[a-z]+:', target):
                    continue
                if target and not target.endswith('.md'):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(src),
                                                     target)) if target else src
                if not os.path.exists(path):
                    print('%s:%d: %s: no such file' % (
                        os.path.relpath(src, ROOT), no, target))
                    bad += 1
                    continue
                if not frag:
                    continue
                if path not in cache:
                    cache[path] = anchors(path)
                if frag[1:] not in cache[path]:
                    print('%s:%d: %s%s' % (os.path.relpath(src, ROOT), no,
                                           target, frag))
                    bad += 1
    print('%d broken link(s)' % bad)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
