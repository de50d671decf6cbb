"""Writes out the program of a docs page as the page shows it: each code block that follows a line
`<!-- file: NAME -->` becomes DIR/NAME, and the block that follows `<!-- output of: PROGRAM -->` becomes
DIR/PROGRAM.expected, what the program must print.

usage: doc_program.py PAGE DIR
"""
import os
import re
import sys

page, out = sys.argv[1:3]
text = open(page).read()
blocks = re.findall(r"<!-- (file|output of): (\S+) -->\n```[a-z]*\n(.*?)```", text, re.S)
if not any(kind == "file" for kind, _, _ in blocks) or not any(kind == "output of" for kind, _, _ in blocks):
    sys.exit(f"{page}: no `<!-- file: NAME -->` block or no `<!-- output of: PROGRAM -->` block")
os.makedirs(out, exist_ok=True)
for kind, name, body in blocks:
    with open(os.path.join(out, name if kind == "file" else name + ".expected"), "w") as f:
        f.write(body)
    print(f"{page}: {name}{'' if kind == 'file' else ' (expected output)'}")
