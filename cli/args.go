package cli

import (
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// flagsFirst moves a command's flags in front of its positional arguments,
// so that `stasis load ID --to DIR` works as well as `stasis load --to DIR
// ID` (urfave/cli v2 stops reading flags at the first positional argument).
// Everything after "--" stays where it is, and so does everything from the
// first positional argument of a command whose arguments are a command line
// (`stasis run --job J python train.py --lr 3`).
func flagsFirst(app *ucli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	rest := args[1:]
	// Global flags, up to the command name.
	i := 0
	for i < len(rest) && strings.HasPrefix(rest[i], "-") && rest[i] != "--" {
		out = append(out, rest[i])
		if takesValue(app.Flags, rest[i]) && i+1 < len(rest) {
			out = append(out, rest[i+1])
			i++
		}
		i++
	}
	cmds := app.Commands
	for i < len(rest) {
		cmd := findCommand(cmds, rest[i])
		if cmd == nil {
			break
		}
		out = append(out, rest[i])
		i++
		if len(cmd.Subcommands) > 0 {
			cmds = cmd.Subcommands
			continue
		}
		var flags, positional []string
		for i < len(rest) {
			a := rest[i]
			if a == "--" || (commandLineArgs[cmd.Name] && !strings.HasPrefix(a, "-")) {
				positional = append(positional, rest[i:]...)
				i = len(rest)
				break
			}
			if strings.HasPrefix(a, "-") && a != "-" {
				flags = append(flags, a)
				if takesValue(cmd.Flags, a) && i+1 < len(rest) {
					flags = append(flags, rest[i+1])
					i++
				}
			} else {
				positional = append(positional, a)
			}
			i++
		}
		return append(append(out, flags...), positional...)
	}
	return append(out, rest[i:]...)
}

// commandLineArgs are the commands whose positional arguments are a
// command line to run, with flags of its own.
var commandLineArgs = map[string]bool{"run": true}

func findCommand(cmds []*ucli.Command, name string) *ucli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue reports whether arg ("--to", "-to") names a flag that is
// followed by a separate value (not "--to=DIR", not a boolean).
func takesValue(flags []ucli.Flag, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if bf, ok := f.(*ucli.BoolFlag); ok && bf != nil {
				return false
			}
			return true
		}
	}
	return false
}
