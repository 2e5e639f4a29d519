"""A process whose state lives only in its memory, for the suspend, snapshot and fork tests: a
counter and a random secret, written to /tmp/state every 20 ms.

Each write is a new file renamed into place: a reader of a file rewritten in place can see the
end of the next write after the start of this one (``cat`` reads twice; when the count gains a
digit the second read returns the longer line's last byte: seen once in CI)."""

COUNTER = (
    "python3 -c 'import os, secrets, time\nn, s = 0, secrets.token_hex(16)\nwhile True:\n"
    '    n += 1\n    open("/tmp/state.new", "w").write(f"{n} {s}")\n'
    '    os.replace("/tmp/state.new", "/tmp/state")\n    time.sleep(0.02)\''
)
