# presenced: one static binary on a distroless base (no shell, no package
# manager, runs as uid 65532). Only public official images: golang to
# build, gcr.io/distroless/static to run.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/presenced ./cmd/presenced \
 && mkdir -p /out/data/nats

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/presenced /presenced
# The embedded nats-server's JetStream store (--nats-store-dir): owned by
# the nonroot user, so a volume mounted here starts out writable.
COPY --from=build --chown=65532:65532 /out/data /data
# 8080 HTTP/WebSocket (node), 9090 aggregator HTTP; the embedded
# nats-server's client 4222, cluster 6222 and gateway 7222.
EXPOSE 8080 9090 4222 6222 7222
ENTRYPOINT ["/presenced"]
CMD ["node"]
