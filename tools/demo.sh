#!/usr/bin/env bash
# Set up, then run the main job on the bundled sample data:
# build -> pack -> validate -> inspect -> read a few batches, for text, chat and multimodal data,
# and a weighted mixture of text, chat and image-text stores as one collection.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PF=.venv/bin/packfmt
OUT=${OUT:-demo_out}
TOK=packfmt/sample_data/tokenizer
mkdir -p "$OUT"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "build: text JSONL -> $OUT/text"
$PF build text packfmt/sample_data/text.jsonl -o "$OUT/text" --tokenizer "$TOK" --overwrite --no-progress
step "build: chat JSONL (assistant-only loss mask) -> $OUT/chat"
$PF build chat packfmt/sample_data/chat.jsonl -o "$OUT/chat" --tokenizer "$TOK" --overwrite --no-progress
step "build: easy-vqa images + questions -> $OUT/vqa"
$PF build easy-vqa "$OUT/vqa" --tokenizer "$TOK" --image-tokens 16 --limit 400 --overwrite --no-progress

step "pack: first-fit-decreasing and the greedy baseline"
$PF pack "$OUT/text" --capacity 1024 --algorithm ffd --overwrite
$PF pack "$OUT/text" --capacity 1024 --algorithm greedy --overwrite
$PF pack "$OUT/chat" --capacity 1024 --algorithm bfd --materialize --overwrite
$PF pack "$OUT/vqa" --capacity 256 --algorithm balanced --max-images-per-pack 8 --overwrite

step "collection: text + chat + image-text of one tokenizer as one dataset, packed globally with books weighted 2x"
head -n 30 packfmt/sample_data/text.jsonl > "$OUT/web.jsonl"
tail -n 30 packfmt/sample_data/text.jsonl > "$OUT/books.jsonl"
for src in web books; do
  $PF build text "$OUT/$src.jsonl" -o "$OUT/$src" --tokenizer "$TOK" --overwrite --no-progress > /dev/null
done
# the text stores have no loss mask (read as all-trained), chat has one, vqa has images: the collection records it
$PF merge web="$OUT/web" books="$OUT/books" chat="$OUT/chat" vqa="$OUT/vqa" -o "$OUT/mix" --overwrite
$PF pack "$OUT/mix" --capacity 1024 --algorithm ffd --weights web=1,books=2,vqa=0.5 --name mix-1024 --overwrite

step "validate --deep"
for d in text chat vqa mix; do $PF validate "$OUT/$d" --deep; done

step "inspect"
$PF inspect "$OUT/text" --plot "$OUT/text.png"
$PF inspect "$OUT/chat" --show-pack 0 --tokenizer "$TOK"
$PF inspect "$OUT/mix"

step "read batches (PackedDataset + varlen collate, 2 DataLoader workers)"
.venv/bin/python tools/read_batches.py "$OUT/text" --index ffd-1024 --batch-size 4 --batches 2 --tokenizer "$TOK"
.venv/bin/python tools/read_batches.py "$OUT/chat" --index bfd-1024 --batch-size 2 --batches 1 --tokenizer "$TOK"
.venv/bin/python tools/read_batches.py "$OUT/mix" --index mix-1024 --batch-size 2 --batches 1 --tokenizer "$TOK"
printf '\nDone. Plot: %s/text.png\n' "$OUT"
