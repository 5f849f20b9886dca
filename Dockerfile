# presenced: one static binary on a small base.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/presenced ./cmd/presenced

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/presenced /presenced
EXPOSE 8080
ENTRYPOINT ["/presenced"]
CMD ["node"]
