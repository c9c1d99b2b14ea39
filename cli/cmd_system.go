package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/stasis-ckpt/stasis/bench"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/doctor"
	"github.com/stasis-ckpt/stasis/gdswriter"
	ucli "github.com/urfave/cli/v2"
)

func (e *env) doctorCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "doctor",
		Usage: "check what this machine offers stasis: CRIU, kernel, CUDA checkpoint API, cuFile, the store",
		Flags: []ucli.Flag{&ucli.BoolFlag{Name: "json", Usage: "print the checks as JSON"}},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			criuPath, _ := criu.Find() // "" lets doctor report it missing
			checks := doctor.Run(c.Context, doctor.Options{StoreDir: storeDir(c), CRIUPath: criuPath})
			if c.Bool("json") {
				return printJSON(e.stdout, map[string]any{"checks": checks, "worst": doctor.Worst(checks)})
			}
			tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
			for _, ch := range checks {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", ch.Status, ch.Name, ch.Detail)
				if ch.Hint != "" {
					fmt.Fprintf(tw, "\t\t-> %s\n", ch.Hint)
				}
			}
			return tw.Flush()
		},
	}
}

func (e *env) benchCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "bench",
		Usage: "measure stasis save and load against raw O_DIRECT I/O of the same bytes, in one run",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "size", Value: "2GiB", Usage: "bytes to write and read (KiB, MiB, GiB suffixes)"},
			&ucli.StringFlag{Name: "dir", Required: true, Usage: "directory on the disk to measure (a scratch store is made and removed there)"},
			&ucli.StringFlag{Name: "compress", Value: "none", Usage: "none, zstd, s2 or auto"},
			&ucli.StringFlag{Name: "data", Value: "bf16", Usage: "bf16 (normal(0, 0.02) values, like model weights) or random"},
			&ucli.DurationFlag{Name: "settle", Value: time.Second, Usage: "before each timed step, sync and wait this long for the disk to finish earlier work"},
			&ucli.IntFlag{Name: "rounds", Value: 3, Usage: "alternate raw and stasis runs this many times; the best of each is reported"},
			&ucli.IntFlag{Name: "workers", Usage: "goroutines for both (default: one per CPU)"},
			&ucli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			size, err := bench.ParseSize(c.String("size"))
			if err != nil {
				return usagef("--size: " + err.Error())
			}
			method, err := gdswriter.ParseMethod(c.String("compress"))
			if err != nil {
				return usagef("--compress: " + err.Error())
			}
			o := bench.Options{Dir: c.String("dir"), Size: size, Method: method, Data: c.String("data"), Rounds: c.Int("rounds"), Workers: c.Int("workers"), Settle: c.Duration("settle")}
			if !c.Bool("json") {
				o.Log = func(msg string) { fmt.Fprintln(e.stderr, msg) }
			}
			res, err := bench.Run(c.Context, o)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(e.stdout, res)
			}
			tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "bytes\t%s (%s data, compress %s, %d workers, O_DIRECT %v)\n", humanBytes(res.Bytes), res.Data, res.Compress, res.Workers, res.Direct)
			fmt.Fprintf(tw, "raw write\t%.2f GB/s\n", res.RawWriteGBps)
			fmt.Fprintf(tw, "stasis save\t%.2f GB/s\t(%.2f x raw)\n", res.SaveGBps, res.SaveRatio)
			fmt.Fprintf(tw, "raw read\t%.2f GB/s\n", res.RawReadGBps)
			fmt.Fprintf(tw, "stasis load\t%.2f GB/s\t(%.2f x raw)\n", res.LoadGBps, res.LoadRatio)
			fmt.Fprintf(tw, "stored\t%s\t(%.3f of the bytes)\n", humanBytes(res.StoredBytes), res.StoredRatio)
			return tw.Flush()
		},
	}
}
