package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/presence-dev/presence/client"
	"github.com/presence-dev/presence/protocol"
)

// A service present in a room: it joins, sets its state and prints the
// members as they change. The token source is called on every connect.
func Example() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{
		URL:     "ws://127.0.0.1:8080",
		Token:   func(context.Context) (string, error) { return os.Getenv("PRESENCE_TOKEN"), nil },
		Session: "build-bot-1", // kept across reconnects: a blip announces nothing
		OnError: func(err error) { log.Print(err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	var room *client.Room
	room, err = c.Join(ctx, "team7-general", client.JoinOptions{
		OnChange: func(ch client.Change) {
			if ch.Kind == client.Applied {
				fmt.Println(ch.Event.User, ch.Event.Kind)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := room.SetState(ctx, map[string]string{"status": "building"}); err != nil {
		log.Print(err)
	}
	for _, m := range room.Members() {
		fmt.Println(m.User, len(m.Sessions))
	}
}

// A dashboard follows a lobby's member count without being counted in it
// (the token needs the observe claim).
func ExampleClient_Join_count() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{URL: "ws://127.0.0.1:8080", Token: token})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	lobby, err := c.Join(ctx, "lobby", client.JoinOptions{
		Count:    true,
		Observe:  true,
		OnChange: func(ch client.Change) { fmt.Println("online:", ch.Count) },
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("online now:", lobby.Count())
}

// A chat shows presence dots for the people on screen only.
func ExampleClient_Watch() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{URL: "ws://127.0.0.1:8080", Token: token})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	w, err := c.Watch(ctx, "team7-general", []string{"u_1", "u_2"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range w.Members() {
		fmt.Println(m.User, "is here")
	}
	// The screen scrolled: a new list replaces the old one.
	if err := w.Update(ctx, []string{"u_2", "u_3"}); err != nil {
		log.Print(err)
	}
}

// Errors carry the protocol's codes; a refused join is a *protocol.Error,
// a refused handshake a *client.HandshakeError, and the client's end its
// Err.
func ExampleClient_Err() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{URL: "ws://127.0.0.1:8080", Token: token})
	var he *client.HandshakeError
	if errors.As(err, &he) && he.Status == 401 {
		log.Fatalf("the node refused the token: %s", he.Message)
	} else if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Join(ctx, "team8-secret", client.JoinOptions{}); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeForbidden {
			fmt.Println("not for us:", pe.Message)
		}
	}
	<-c.Done()
	var ce *client.CloseError
	if errors.As(c.Err(), &ce) && ce.Code == protocol.CloseRevoked {
		fmt.Println("revoked until", ce.RevokedUntil)
	}
}

func token(context.Context) (string, error) { return os.Getenv("PRESENCE_TOKEN"), nil }
