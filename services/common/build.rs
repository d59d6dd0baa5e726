//! Rebuilds this crate when a migration is added: `sqlx::migrate!` embeds the migration files, but
//! cargo tracks only the files it read, never the directories, so a new file would go unnoticed.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
