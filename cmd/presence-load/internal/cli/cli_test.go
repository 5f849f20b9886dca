package cli

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

type testOpts struct {
	Addr    string        `flag:"addr" default:"127.0.0.1:8080" help:"node address"`
	Rate    float64       `flag:"rate,r" default:"1000" help:"joins per second"`
	N       int           `flag:"n" help:"from the struct's value"`
	Hold    time.Duration `flag:"hold" default:"60s" help:"how long"`
	Deflate bool          `flag:"deflate" help:"offer \"permessage-deflate\""`
	Derived string        // not a flag
}

func TestParseDefaultsAndGiven(t *testing.T) {
	o := testOpts{N: 7, Derived: "kept"}
	given, err := Parse("test", []string{"--rate", "250", "--deflate"}, &o)
	if err != nil {
		t.Fatal(err)
	}
	want := testOpts{Addr: "127.0.0.1:8080", Rate: 250, N: 7, Hold: time.Minute, Deflate: true, Derived: "kept"}
	if o != want {
		t.Fatalf("got %+v, want %+v", o, want)
	}
	if len(given) != 2 || !given["rate"] || !given["deflate"] {
		t.Fatalf("given %v, want rate and deflate", given)
	}
}

func TestParseSeveralStructsAndErrors(t *testing.T) {
	type more struct {
		Room int `flag:"room-size" default:"15000" help:"members"`
	}
	var a testOpts
	var b more
	if _, err := Parse("test", []string{"--room-size", "10", "--addr", "x:1"}, &a, &b); err != nil || b.Room != 10 || a.Addr != "x:1" {
		t.Fatalf("%v: %+v %+v", err, a, b)
	}
	if _, err := Parse("test", []string{"-r", "5"}, &a); err != nil || a.Rate != 5 {
		t.Fatalf("alias: %v, rate %v", err, a.Rate)
	}
	if _, err := Parse("test", []string{"extra"}, &a); err == nil || !strings.Contains(err.Error(), `unexpected arguments "extra"`) {
		t.Fatalf("positional argument: %v", err)
	}
	if _, err := Parse("test", []string{"--nope"}, &a); err == nil {
		t.Fatal("an unknown flag parsed")
	}
	if _, err := Parse("test", []string{"--rate", "fast"}, &a); err == nil {
		t.Fatal("a bad value parsed")
	}
	if _, err := Parse("test", []string{"-h"}, &a); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

func TestRegisterRefusesBadTags(t *testing.T) {
	for name, opts := range map[string]any{
		"not a pointer": testOpts{},
		"bad type": &struct {
			X []string `flag:"x"`
		}{},
		"bad default": &struct {
			X int `flag:"x" default:"many"`
		}{},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: registered", name)
				}
			}()
			Register(flag.NewFlagSet("", flag.ContinueOnError), opts)
		}()
	}
}
