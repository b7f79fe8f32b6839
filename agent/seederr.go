package agent

import (
	"errors"
	"fmt"

	"agentkit/workspace"
)

// workspaceFilesError words a failure to write a request's workspace files.
// A path the workspace refuses (it leads out through a symlink, it is not
// a regular file, it is reserved) is the client's to change: an
// *InvalidError naming workspaceFiles and the path. Anything else (a full
// disk, a permission) is the host's problem and stays an internal error.
func workspaceFilesError(err error) error {
	var fe *workspace.FileError
	if errors.As(err, &fe) && (errors.Is(fe, workspace.ErrUnsafePath) || errors.Is(fe, workspace.ErrNotRegular) || errors.Is(fe, workspace.ErrReserved)) {
		ie := &InvalidError{Field: "workspaceFiles", Message: fmt.Sprintf("%q: %v", fe.Path, fe.Err)}
		if errors.Is(fe, workspace.ErrReserved) {
			ie.Err = ErrReservedPath
		}
		return ie
	}
	return fmt.Errorf("agent: writing workspace files: %w", err)
}
