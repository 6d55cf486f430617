"""Read .env files: KEY=VALUE lines, comments, blank lines, optional `export` and quotes."""


def parse(text):
    env = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        if "=" not in line:
            raise ValueError(f"line {number}: expected KEY=VALUE, got {raw!r}")
        key, value = line.split("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key] = value
    return env
