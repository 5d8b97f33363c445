#!/bin/bash
set -euo pipefail
echo "$GREETING from harbor" > /app/answer.txt
