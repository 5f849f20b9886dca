# Quick start: `make dev` runs the service on embedded defaults, `make test`
# runs the tests. Both install redis-server first when it is missing
# (Debian, as root); the tests start their own servers.
.PHONY: dev test deps bench fuzz

deps:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || \
	  { echo "installing redis-server"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

dev: deps
	go run ./cmd/presenced dev

test: deps
	go test -race -count=1 ./...

bench: deps
	go test ./region -run '^$$' -bench BenchmarkRefresh -count 3

# The decoders of what arrives from NATS, 30 s each.
fuzz:
	go test ./bus -run '^$$' -fuzz FuzzDecodeEvent -fuzztime 30s
	go test ./global -run '^$$' -fuzz FuzzDecodePublication -fuzztime 30s
