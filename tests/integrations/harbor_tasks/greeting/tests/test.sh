#!/bin/bash
# Reward 1 when the answer is exactly right, else 0.
if [ "$(cat /app/answer.txt 2>/dev/null)" = "hello from harbor" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
