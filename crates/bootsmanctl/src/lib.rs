//! `bootsmanctl`: the command-line tool of Bootsman. It installs the platform and manages the
//! hosts of a pool (for example, it issues the one-time bootstrap tokens hosts enrol with).
