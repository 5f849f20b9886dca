// Package cli is how every mode of the load tool reads its flags: each
// flag is a field of the mode's options struct, tagged
//
//	Rate float64 `flag:"rate" default:"1000" help:"joins per second"`
//
// A flag tag may name several flags, "rates,sweep": the others set the
// same field. A field without a default tag defaults to the value it holds when it is
// registered (for defaults that are another package's constants). Fields
// without a flag tag are not flags. Types: string, int, float64, bool and
// time.Duration.
package cli

import (
	"flag"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Register adds the flags of opts, a pointer to a struct, to fs. A tag it
// cannot use (an unknown type, a default that does not parse) is an error
// in the tool, not in its flags: it panics, and every mode's test that
// parses its flags catches it.
func Register(fs *flag.FlagSet, opts any) {
	v := reflect.ValueOf(opts)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("cli.Register: %T is not a pointer to a struct", opts))
	}
	v = v.Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name, ok := f.Tag.Lookup("flag")
		if !ok {
			continue
		}
		names := strings.Split(name, ",")
		if err := register(fs, v.Field(i), names[0], f.Tag.Get("help"), f.Tag); err != nil {
			panic(fmt.Sprintf("cli.Register: %s.%s: %v", v.Type(), f.Name, err))
		}
		for _, alias := range names[1:] {
			_ = register(fs, v.Field(i), alias, "the same as --"+names[0], "")
		}
	}
}

func register(fs *flag.FlagSet, field reflect.Value, name, help string, tag reflect.StructTag) error {
	if def, ok := tag.Lookup("default"); ok {
		if err := set(field, def); err != nil {
			return fmt.Errorf("default %q: %w", def, err)
		}
	}
	switch p := field.Addr().Interface().(type) {
	case *string:
		fs.StringVar(p, name, *p, help)
	case *int:
		fs.IntVar(p, name, *p, help)
	case *float64:
		fs.Float64Var(p, name, *p, help)
	case *bool:
		fs.BoolVar(p, name, *p, help)
	case *time.Duration:
		fs.DurationVar(p, name, *p, help)
	default:
		return fmt.Errorf("type %s is not a flag type", field.Type())
	}
	return nil
}

// set parses s into field as its flag would.
func set(field reflect.Value, s string) error {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	if err := register(fs, field, "x", "", ""); err != nil {
		return err
	}
	return fs.Set("x", s)
}

// Parse parses a mode's args into opts (each a pointer to a tagged
// struct), refuses positional arguments, and returns the names of the
// flags given. -h prints the flags and returns flag.ErrHelp.
func Parse(mode string, args []string, opts ...any) (given map[string]bool, err error) {
	fs := flag.NewFlagSet("presence-load "+mode, flag.ContinueOnError)
	for _, o := range opts {
		Register(fs, o)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected arguments %q", mode, strings.Join(fs.Args(), " "))
	}
	given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given, nil
}
