"""Writes the parquet fixtures of `crates/rl/tests/data.rs` the way verl's
data preprocessing does (`examples/data_preprocess/gsm8k.py`: a `datasets`
table written by pyarrow, snappy-compressed, nested chat prompt and
`reward_model` / `extra_info` structs), plus the same rows as JSONL for the
test to compare with, a zstd-compressed copy (polars' default codec) and a
gzip-compressed one (a codec colo does not read, for the error test).

Usage (pyarrow in any environment; not a dependency of colo):
    python3 make_verl_parquet.py   # in crates/rl/tests/data
"""
import json

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
QUESTIONS = [
    ("Ann has 3 boxes of 12 pencils and gives away 9. How many are left?", "27"),
    ("A train travels 60 km an hour for 2.5 hours. How far does it go?", "150"),
    ("Tom reads 14 pages a day. How many pages does he read in 3 weeks?", "294"),
]

rows = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": a},
        "extra_info": {"split": "train", "index": i, "answer": f"... #### {a}", "question": q},
    }
    for i, (q, a) in enumerate(QUESTIONS)
]
table = pa.Table.from_pylist(rows)
pq.write_table(table, "gsm8k-verl.parquet")  # pyarrow's default codec: snappy
pq.write_table(table, "gsm8k-verl-zstd.parquet", compression="zstd")
pq.write_table(table, "gsm8k-verl-gzip.parquet", compression="gzip")
with open("gsm8k-verl.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(table.schema)
print(pq.ParquetFile("gsm8k-verl.parquet").metadata.row_group(0).column(0).compression)
