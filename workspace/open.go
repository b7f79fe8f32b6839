package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// kindOf names what a non-regular file is, for error messages.
func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a folder"
	}
	return "not a regular file"
}

// notRegular is the error for a path that names something other than a
// regular file.
func notRegular(shown string, m fs.FileMode) error {
	return fmt.Errorf("%w: %s is %s; only regular files can be read or written", ErrNotRegular, shown, kindOf(m))
}

// openRegular opens name in root with flag, refusing (ErrNotRegular)
// anything but a regular file: a named pipe or a device would block the
// open or the read until another process acts, and a turn must not wait on
// that. The path is checked before opening, opened with O_NONBLOCK so that
// a file swapped for a pipe in between does not block either, and checked
// again on the open file. shown is the path as the model knows it.
func openRegular(root *os.Root, name, shown string, flag int, perm fs.FileMode) (*os.File, error) {
	if st, err := root.Stat(name); err == nil && !st.Mode().IsRegular() {
		return nil, notRegular(shown, st.Mode())
	} else if err != nil && !(errors.Is(err, fs.ErrNotExist) && flag&os.O_CREATE != 0) {
		return nil, fsError(shown, err)
	}
	f, err := root.OpenFile(name, flag|nonBlock, perm)
	if err != nil {
		return nil, fsError(shown, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fsError(shown, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, notRegular(shown, st.Mode())
	}
	return f, nil
}

// writeRegular replaces the content of the regular file name in root (or
// creates it with filePerm). It never truncates or writes anything that is
// not a regular file.
func writeRegular(root *os.Root, name, shown string, data []byte) error {
	f, err := openRegular(root, name, shown, os.O_WRONLY|os.O_CREATE, filePerm)
	if err != nil {
		return err
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fsError(shown, err)
	}
	return nil
}
