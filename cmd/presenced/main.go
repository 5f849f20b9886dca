// Command presenced runs the presence service.
package main

import (
	"fmt"
	"os"
)

var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("presenced", version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: presenced version")
	os.Exit(2)
}
