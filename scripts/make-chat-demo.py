#!/usr/bin/python3
# Writes the chat demo's conversations (configs/chat/arithmetic.jsonl): a user asks for a sum,
# a difference or a product of two small numbers, the assistant answers with the worked result.
# Seeded, so the file is the same on every machine; a model learns the format and the carries,
# and the loss counts the assistant's answers only (docs/data.md).
# Usage: scripts/make-chat-demo.py [OUT] [COUNT]
import json
import random
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "configs/chat/arithmetic.jsonl"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
rng = random.Random(30)
asks = ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?", "Please work out {a} {op} {b}."]
with open(out, "w") as f:
    for _ in range(count):
        turns = []
        if rng.random() < 0.3:
            turns.append({"role": "system", "content": "You answer arithmetic questions with the result."})
        for _ in range(rng.choice([1, 1, 2])):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            op = rng.choice(["+", "-", "*"])
            value = a + b if op == "+" else a - b if op == "-" else a * b
            turns.append({"role": "user", "content": rng.choice(asks).format(a=a, op=op, b=b)})
            turns.append({"role": "assistant", "content": f"{a} {op} {b} = {value}"})
        f.write(json.dumps({"messages": turns}) + "\n")
