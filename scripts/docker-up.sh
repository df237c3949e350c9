#!/usr/bin/env bash
# Placeholder until the runtime issue: Docker tests skip with the reason.
exit 0
