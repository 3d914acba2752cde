#!/usr/bin/env python3
"""Per-column statistics for a CSV file, printed as JSON. Standard library only."""

import argparse
import collections
import csv
import json
import math
import statistics
import sys


def parse_number(text):
    if "_" in text:  # float() accepts "1_000"; a CSV cell like that is text
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if math.isnan(value) or math.isinf(value):
        return None
    return value


def tidy(value):
    """Round floats for display and print integral values as integers."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        return round(value, 6)
    return value


def column_stats(name, cells, top):
    present = [c for c in cells if c.strip() != ""]
    stats = {
        "name": name,
        "count": len(present),
        "missing": len(cells) - len(present),
        "distinct": len(set(present)),
    }
    numbers = [parse_number(c.strip()) for c in present]
    if present and all(n is not None for n in numbers):
        stats["type"] = "numeric"
        stats["min"] = tidy(min(numbers))
        stats["max"] = tidy(max(numbers))
        stats["mean"] = tidy(statistics.fmean(numbers))
        stats["median"] = tidy(float(statistics.median(numbers)))
        stats["stdev"] = tidy(statistics.stdev(numbers)) if len(numbers) > 1 else 0
    else:
        stats["type"] = "text"
        counts = collections.Counter(present)
        stats["top"] = [[value, n] for value, n in counts.most_common(top)]
    return stats


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help="CSV file, relative to the working directory")
    parser.add_argument("--delimiter", help="field separator (default: sniffed)")
    parser.add_argument("--top", type=int, default=3, help="frequent values per text column")
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error("--top must be >= 0")

    try:
        with open(args.path, newline="", encoding="utf-8-sig") as handle:
            sample = handle.read(4096)
            handle.seek(0)
            delimiter = args.delimiter
            if not delimiter:
                try:
                    delimiter = csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
                except csv.Error:
                    delimiter = ","
            reader = csv.reader(handle, delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                print(f"stats.py: {args.path}: file is empty", file=sys.stderr)
                return 1
            columns = [[] for _ in header]
            rows = 0
            for row in reader:
                if not row:
                    continue
                rows += 1
                for i in range(len(header)):
                    columns[i].append(row[i] if i < len(row) else "")
    except OSError as err:
        print(f"stats.py: cannot read {args.path}: {err.strerror}", file=sys.stderr)
        return 1
    except (csv.Error, UnicodeDecodeError) as err:
        print(f"stats.py: cannot parse {args.path}: {err}", file=sys.stderr)
        return 1

    result = {
        "file": args.path,
        "rows": rows,
        "delimiter": delimiter,
        "columns": [column_stats(name, cells, args.top) for name, cells in zip(header, columns)],
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
