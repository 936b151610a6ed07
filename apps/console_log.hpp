#pragma once
// Where the process's log lines go: info and below on stdout, warnings and
// errors on stderr, so that an error still reaches the terminal when stdout
// goes to a file, and a command whose stdout is its product (`inspect`
// without -o: a JSON or DOT dump) keeps that stream to the product alone.
namespace sg::app {

// Installs the default spdlog logger. every_line_to_stderr: info lines too
// (for a command that writes its product to stdout).
void use_console_log(bool every_line_to_stderr = false);

}  // namespace sg::app
