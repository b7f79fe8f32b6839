package filekv

import (
	"errors"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// The hot paths use system calls directly rather than *os.File, which on
// Linux spends an extra call per open registering the descriptor with the
// network poller (regular files and folders are refused) and os.ReadFile
// another on a stat: a listing opens one file per key.

func retry(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func openFD(op, path string, flags int, perm uint32) (int, error) {
	var fd int
	err := retry(func() (err error) {
		fd, err = unix.Open(path, flags|unix.O_CLOEXEC, perm)
		return err
	})
	if err != nil {
		return -1, &fs.PathError{Op: op, Path: path, Err: err}
	}
	return fd, nil
}

// readFull reads len(b) bytes from fd, or fails with io.ErrUnexpectedEOF.
func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		var n int
		err := retry(func() (err error) {
			n, err = unix.Read(fd, b)
			return err
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

// readFile returns the whole content of path.
func readFile(path string) ([]byte, error) {
	fd, err := openFD("open", path, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := retry(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	b := make([]byte, st.Size)
	if err := readFull(fd, b); err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return b, nil
}

// readHeader returns the first headerSize bytes of path; a shorter file
// fails with io.ErrUnexpectedEOF.
func readHeader(path string) ([headerSize]byte, error) {
	var h [headerSize]byte
	fd, err := openFD("open", path, unix.O_RDONLY, 0)
	if err != nil {
		return h, err
	}
	defer unix.Close(fd)
	if err := readFull(fd, h[:]); err != nil {
		return h, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return h, nil
}

// durable is the seam between the driver and the system calls that make a
// write durable: create, write, fsync and close a file, rename it into
// place, fsync a folder. The store calls them through this interface only,
// so a test can record their order (see sysfile_test.go); realSys is what
// runs.
type durable interface {
	Open(path string, flags int, perm uint32) (int, error)
	Write(fd int, p []byte) (int, error)
	Fsync(fd int) error
	Close(fd int) error
	Rename(from, to string) error
}

// realSys makes the system calls, retrying on EINTR.
type realSys struct{}

func (realSys) Open(path string, flags int, perm uint32) (int, error) {
	return openFD("open", path, flags, perm)
}

func (realSys) Write(fd int, p []byte) (n int, err error) {
	err = retry(func() (err error) {
		n, err = unix.Write(fd, p)
		return err
	})
	return n, err
}

func (realSys) Fsync(fd int) error           { return retry(func() error { return unix.Fsync(fd) }) }
func (realSys) Close(fd int) error           { return unix.Close(fd) }
func (realSys) Rename(from, to string) error { return os.Rename(from, to) }

// writeSynced creates path exclusively, writes the parts and fsyncs it. On
// failure the file is removed.
func writeSynced(sys durable, path string, parts ...[]byte) error {
	fd, err := sys.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, filePerm)
	if err != nil {
		return err
	}
	err = func() error {
		for _, p := range parts {
			for len(p) > 0 {
				n, err := sys.Write(fd, p)
				if err != nil {
					return &fs.PathError{Op: "write", Path: path, Err: err}
				}
				p = p[n:]
			}
		}
		if err := sys.Fsync(fd); err != nil {
			return &fs.PathError{Op: "fsync", Path: path, Err: err}
		}
		return nil
	}()
	if cerr := sys.Close(fd); err == nil && cerr != nil {
		err = &fs.PathError{Op: "close", Path: path, Err: cerr}
	}
	if err != nil {
		unix.Unlink(path)
	}
	return err
}

// syncDir fsyncs a folder, making the entries in it durable.
func syncDir(sys durable, path string) error {
	fd, err := sys.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	err = sys.Fsync(fd)
	sys.Close(fd)
	if err != nil {
		return &fs.PathError{Op: "fsync", Path: path, Err: err}
	}
	return nil
}
