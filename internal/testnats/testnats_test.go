package testnats

import (
	"testing"
	"time"
)

func TestStartServesJetStream(t *testing.T) {
	s := Start(t)
	nc := Connect(t, s)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(); err != nil {
		t.Fatalf("JetStream not enabled: %v", err)
	}
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(2 * time.Second); err != nil {
		t.Fatalf("round trip: %v", err)
	}
}
