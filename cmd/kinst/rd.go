package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
)

func rdCmd(ctx context.Context, args []string) error {
	fs, addr := newFlags("rd", "rd ADDR|SYM[+0xOFF] [LEN] [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pos := fs.Args()
	if len(pos) < 1 || len(pos) > 2 {
		fs.Usage()
		return fmt.Errorf("rd: want ADDR|SYM[+0xOFF] [LEN]")
	}
	n := 64
	if len(pos) == 2 {
		v, err := strconv.ParseUint(pos[1], 0, 32)
		if err != nil {
			return fmt.Errorf("rd: bad length %q", pos[1])
		}
		n = int(v)
	}
	return cli.Read(ctx, api.NewClient(*addr), pos[0], n, *asJSON, stdEnv())
}
