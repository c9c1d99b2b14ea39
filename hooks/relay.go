package hooks

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/stasis-ckpt/stasis/criu"
	"golang.org/x/sys/unix"
)

// Tags by which a process checkpoint taken by stasis run names the pipes
// that were the job's stdout and stderr, so that the restore can hand the
// restored job new ones (criu.InheritFD).
const (
	tagStdout = "stasis.run.stdout"
	tagStderr = "stasis.run.stderr"
)

// relay gives a job that CRIU may checkpoint pipes for stdout and stderr
// and copies what comes out of them to stasis's own. Whatever stasis's
// output is (a terminal, a pipe to a container runtime, a file that grows
// after the dump), the job's is a pipe, which CRIU dumps and which a
// restore replaces with a new one of the next stasis run.
type relay struct {
	jobOut, jobErr *os.File // the job's ends, closed here once it has them
	// tags name the pipes for a checkpoint of the job.
	tags   map[string]string
	copied chan struct{}
}

func newRelay(stdout, stderr io.Writer) (*relay, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	r := &relay{jobOut: outW, jobErr: errW, tags: map[string]string{}, copied: make(chan struct{}, 2)}
	for tag, f := range map[string]*os.File{tagStdout: outW, tagStderr: errW} {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			for _, f := range []*os.File{outR, outW, errR, errW} {
				f.Close()
			}
			return nil, err
		}
		r.tags[tag] = fmt.Sprintf("pipe:[%d]", st.Ino)
	}
	for _, c := range []struct {
		from *os.File
		to   io.Writer
	}{{outR, stdout}, {errR, stderr}} {
		go func() {
			io.Copy(c.to, c.from)
			c.from.Close()
			r.copied <- struct{}{}
		}()
	}
	return r, nil
}

// inherit maps the pipes a checkpoint names (tags) to this relay's.
func (r *relay) inherit(tags map[string]string) []criu.InheritFD {
	var fds []criu.InheritFD
	for tag, f := range map[string]*os.File{tagStdout: r.jobOut, tagStderr: r.jobErr} {
		if key := tags[tag]; key != "" {
			fds = append(fds, criu.InheritFD{Key: key, File: f})
		}
	}
	return fds
}

// handedOver closes stasis's copies of the job's ends: from now on the
// pipes end when the job's tree has closed them.
func (r *relay) handedOver() {
	r.jobOut.Close()
	r.jobErr.Close()
}

// wait waits up to limit for the job's output to be copied out.
func (r *relay) wait(limit time.Duration) {
	timeout := time.After(limit)
	for range 2 {
		select {
		case <-r.copied:
		case <-timeout:
			return
		}
	}
}
