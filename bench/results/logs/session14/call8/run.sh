SANITIZE_BINARY=gpu SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_FILTERS="llm" bash bench/sanitize.sh  # session 14 call 8, same bundle as calls 6-7
